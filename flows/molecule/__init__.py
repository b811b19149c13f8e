"""The molecular property model's stages: prepare, pretrain, finetune, calibrate, baseline, export, register."""
