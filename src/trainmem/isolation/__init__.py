"""One experiment, isolated: a fresh Python process per experiment (`runner`, which imports no torch, and the
`worker` it starts), and the choice of who trains in that process (`engines`: trainmem's loop, CPU ranks over
gloo, one fake-group FSDP2 rank, or transformers' Trainer). A crash or a hang becomes a result row."""
