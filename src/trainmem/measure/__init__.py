"""Real runs, measured: the tensor ledger and allocator readers (`ledger`), the model and optimizer a setup
trains (`build`, shared with the estimator), its data (`data`), the loss rule (`accumulation`), the loop and
its probe (`train`), one experiment's stages (`stages`), the distributed ranks (`gloo`, `fake_rank`), a card
emulated on a bigger one (`emulation`), and the accumulation check (`verify`)."""
