"""The memory of a step, predicted: the model's states (`states`), the closed form (`analytic`), the real step
on the meta device (`simulate`, with the CUDA stand-ins of `standins`, `autocast`, `inplace`, the values it
reads on the host (`hostvalues`) and the bitsandbytes stand-ins of `quantized`), the caching allocator's replay
(`allocator`), sharded ranks (`sharded`, `sharding`) and the calibrations of the runtime (`runtime`)."""
