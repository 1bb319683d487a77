// Test tool: joins the job from the environment with ddprun::init_process_group and runs
// collectives a Python peer (probe.py) mirrors, so C++ and Python workers can share one job.
// Prints "probe rank=R world=W sum=S gathered=a,b,... broadcast=B" and exits 0.
#include <torch/torch.h>

#include <iostream>
#include <sstream>

#include "ddprun/ddp.hpp"

int main() {
  return ddprun::record([] {
    ddprun::InitOptions o;
    o.backend = ddprun::Backend::kGloo;
    auto pg = ddprun::init_process_group(o);
    const int rank = pg->rank();
    auto t = torch::full({3}, static_cast<float>(rank + 1));
    pg->all_reduce(t);
    auto parts = pg->all_gather(torch::tensor({static_cast<int64_t>(rank * 10)}));
    auto b = torch::tensor({rank == 0 ? 42.0 : -1.0}, torch::kDouble);
    pg->broadcast(b, 0);
    pg->barrier();
    std::ostringstream gathered;
    for (size_t i = 0; i < parts.size(); ++i) {
      gathered << (i ? "," : "") << parts[i].item<int64_t>();
    }
    std::cout << "probe impl=cpp rank=" << rank << " world=" << pg->size()
              << " sum=" << t[0].item<float>() << " gathered=" << gathered.str()
              << " broadcast=" << b.item<double>() << std::endl;
    return 0;
  });
}
