"""What a run is, before anything runs: the typed setup (`setup`), the model spec and its presets (`specs`,
`presets`), a setup read from files and flags (`sources`), the chapter's seven runs (`chapter`), and a setup
as the commands that reproduce it (`commands`). Torch-free at import; the lowest layer beside `hardware`."""
