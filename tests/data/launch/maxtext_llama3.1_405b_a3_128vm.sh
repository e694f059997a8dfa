# Restates MaxText's Llama 3.1 405B script for 128 A3 VMs (8 H100 each):
# AI-Hypercomputer/maxtext src/maxtext/configs/gpu/a3/llama_3.1_405b/128vm.sh
# @e591f30cbbf217ed67ef71263ec0538239f9c3b8 (see MANIFEST.md).
EXECUTABLE=train
python3 -m maxtext.trainers.pre_train.$EXECUTABLE configs/models/llama3.1_405b.yml \
    base_config=base.yml hardware=gpu steps=10 model_name=llama3.1-405b \
    attention=cudnn_flash_te remat_policy=full scan_layers=True \
    dataset_type=synthetic per_device_batch_size=1.0 max_target_length=8192 \
    dcn_fsdp_parallelism=128 ici_fsdp_parallelism=8
