"""reinforce_pro inside the trainers users already run (docs/integrations.md).

Each module here adapts one trainer to the one implementation of the corrections, `algos.is_correction`:
- `openrlhf`: OpenRLHF's own `train_ppo_ray` with `reinforce_pro` registered (a launcher, and a patch for forks);
- `trl`: a `GRPOTrainer` subclass whose `vllm_importance_sampling_mode` gains `prefix_mask` / `prefix_truncate`;
- `verl`: verl's own `main_ppo`, with `rollout_is=prefix` beside its `token` and `sequence` levels.
Each checks the installed release first and fails with one line (`releases.UnsupportedRelease`) on one it was
not tested against. `openrlhf` and `verl` import nothing of their trainer until they register; `trl` subclasses
TRL's trainer, so importing it imports TRL. The core (`reinforce_pro.algos`) needs only torch.
"""
