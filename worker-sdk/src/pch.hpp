// Precompiled header shared by every LibTorch translation unit of the SDK, its tests, the
// examples and the benchmark (REUSE_FROM ddprun_sdk): LibTorch's headers dominate compile time.
#pragma once

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/torch.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
