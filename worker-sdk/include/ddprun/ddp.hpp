// The ddprun worker SDK in one include: environment, process group and collectives,
// DistributedDataParallel, DistributedSampler, error recording. See worker-sdk/README.md.
#pragma once

#include "ddprun/checkpoint.hpp"
#include "ddprun/comm_hooks.hpp"
#include "ddprun/data_parallel.hpp"
#include "ddprun/env.hpp"
#include "ddprun/heartbeat.hpp"
#include "ddprun/join.hpp"
#include "ddprun/object_collectives.hpp"
#include "ddprun/process_group.hpp"
#include "ddprun/record.hpp"
#include "ddprun/sampler.hpp"
#include "ddprun/sync_batchnorm.hpp"
#include "ddprun/training_loop.hpp"
#include "ddprun/zero_optimizer.hpp"
