// What --nproc-per-node=cpu|gpu|auto count, without loading CUDA: GPUs the NVIDIA driver
// lists (/proc/driver/nvidia/gpus, else /dev/nvidiaN) limited by CUDA_VISIBLE_DEVICES as CUDA
// reads it (up to the first invalid entry), and the cores this process may run on.
#pragma once

#include "launcher/cli_parser.hpp"

namespace ddprun::launcher {

int cuda_device_count(const GetEnv& getenv);
int usable_cpu_count();

// Counts the entries of a CUDA_VISIBLE_DEVICES value CUDA would use.
int visible_device_entries(const std::string& value);

}  // namespace ddprun::launcher
