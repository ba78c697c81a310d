"""The time of a step, predicted: the kernels a step launches and the bytes they move, counted on the meta
device (`kernels`), and the step-time model over a card's datasheet figures (`step`)."""
