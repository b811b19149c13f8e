"""The sensor failure detector's stages: prepare, pretrain, finetune, calibrate, baseline, export, register."""
