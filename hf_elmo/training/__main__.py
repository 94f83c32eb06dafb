"""`python -m hf_elmo.training ARGS` = `elmo pretrain ARGS`, for launchers: `accelerate launch -m hf_elmo.training`,
`torchrun -m hf_elmo.training`."""

from .pretrain import main

main()
