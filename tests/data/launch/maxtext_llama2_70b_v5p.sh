# Restates the MaxText Llama 2 70B script for one v5p-512 slice (256 chips; "a 4M token global
# batch"): AI-Hypercomputer/maxtext MaxText/configs/v5p/llama2_70b.sh
# @70a609f390b57b60b8ab4da6a613e87cd0e8068a (see MANIFEST.md).
EXECUTABLE=${EXECUTABLE:-train}
python3 -m MaxText.$EXECUTABLE MaxText/configs/base.yml model_name=llama2-70b \
  base_output_directory=$OUTPUT_PATH dataset_path=${DATASET_PATH} \
  remat_policy=save_dot_except_mlpwi per_device_batch_size=4 \
  steps=30 enable_checkpointing=false max_target_length=4096
