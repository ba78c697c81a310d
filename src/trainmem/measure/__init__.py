"""Real runs, measured: the tensor ledger and allocator readers (`ledger`), the model and optimizer a setup
trains (`build`, shared with the estimator), its data (`data`), the loss rule (`accumulation`), the loop and
its probe (`train`), one experiment's stages (`stages`), who trains (`engines`: the loop, `gloo` ranks, a
`fake_rank`, transformers' Trainer), a card emulated on a bigger one (`emulation`), a fresh process per
experiment (`runner`, `worker`, `job`), and the accumulation check (`verify`).

Nothing is imported here: `runner` must stay importable without torch."""
