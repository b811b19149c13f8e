"""The sensor failure detector's stages: prepare, pretrain, finetune, calibrate, novelty, baseline, export, register."""
