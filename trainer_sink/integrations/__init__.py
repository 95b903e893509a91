"""The sink in the training loops people already run, one module per framework, each behind its extra:

- ``trainer_sink.integrations.hf_trainer``: ``MixflowTrainer``, a Hugging Face ``Trainer``
  (``pip install "mixflow[huggingface]"``);
- ``trainer_sink.integrations.lightning_data``: ``MixflowDataModule``, a ``LightningDataModule``
  (``pip install "mixflow[lightning]"``);
- ``trainer_sink.integrations.torchtitan_data``: ``MixflowDataLoader``, a torchtitan dataloader
  (``pip install "mixflow[torchtitan]"``); ``torchtitan_cp_trainer``: ``MixflowCPTrainer``, torchtitan's
  ``Trainer`` over a static context-parallel job, each rank reading its own slices (``torchtitan_cp``);
- ``trainer_sink.integrations.megatron_data``: ``MixflowDataIterator``, Megatron-Core's and Megatron-LM's
  data iterator (``pip install "mixflow[megatron]"``; the batch layout in ``megatron_batch``).

Nothing is imported here: importing a module imports its framework, and only that one."""
