"""Questions over many setups: a grid measured or estimated row by row (`sweep`), the largest micro-batch that
fits a card (`maxbatch`), the fastest setup that fits (`plan`)."""
