"""The LightningCLI config the kill-and-resume soak runs (2 DDP ranks on CPU, tiny TinyGPT),
as YAML text.

Kept here, not in configs/, because it points at the run's temporary directories.
"""

from __future__ import annotations

from pathlib import Path

TEMPLATE = """\
seed_everything: 0
trainer:
  accelerator: cpu
  devices: 2
  strategy: ddp
  max_epochs: {epochs}
  default_root_dir: {work}
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
  num_sanity_val_steps: 0
  callbacks:
    - class_path: lightning_module.callbacks.PackLogger
      init_args:
        directory: {logs}
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args:
        dirpath: {ckpt}
        filename: "{{step}}"
        every_n_train_steps: {every}
        save_top_k: -1
    - class_path: bcl_bench.soak_callbacks.SlowSteps
      init_args:
        seconds: {sleep}
    - class_path: bcl_bench.soak_callbacks.SlowSave
      init_args:
        marker_dir: "{markers}"
        seconds: {save_sleep}
model:
  class_path: lightning_module.tinygpt.TinyGPT
  init_args:
    config:
      vocab_size: 256
      d_model: 16
      n_layers: 1
      n_heads: 2
      ffn_hidden: 32
      max_seq_len: 128
data:
  data: {data}
  format: mds
  seed: 3
  plan:
    pack_size: {pack}
    window: 4
  loader:
    num_workers: {workers}
    persistent_workers: {persistent}
"""


def write_config(
    path: Path,
    *,
    data: Path,
    work: Path,
    epochs: int = 2,
    every: int = 5,
    sleep: float = 0.0,
    pack: int = 4,
    workers: int = 0,
    persistent: bool = False,
    ckpt: Path | None = None,
    save_sleep: float = 0.0,
) -> Path:
    """Write the YAML for one run whose logs go to ``work/logs`` and checkpoints to ``work/ckpt``
    (or ``ckpt``: a directory several resumed runs share). Each checkpoint save writes a
    ``work/markers/saving-<step>`` file, then sleeps ``save_sleep`` seconds."""
    path.write_text(
        TEMPLATE.format(
            epochs=epochs,
            work=work,
            logs=work / "logs",
            ckpt=ckpt or work / "ckpt",
            every=every,
            sleep=sleep,
            data=data,
            pack=pack,
            workers=workers,
            persistent=str(persistent).lower(),
            markers=work / "markers",
            save_sleep=save_sleep,
        )
    )
    return path
