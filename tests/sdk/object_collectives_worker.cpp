// Test tool: the object collectives and reduce of ddprun's SDK under a launcher. Each rank
// writes what it ends up with to OUT/rank<R>/ (raw bytes; a tensor as <name>.bin plus
// <name>.shape), the layout object_collectives_worker.py writes for torch.distributed, so the
// test compares the two trees file by file.
//   object_collectives_worker OUT            the collectives
//   object_collectives_worker --barrier-timeout   rank 1 skips a barrier(500 ms)
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "ddprun/ddp.hpp"

namespace {

namespace fs = std::filesystem;

// The same pattern as the Python worker's big_object().
std::string big_object() {
  std::string s(1 << 20, '\0');
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>((i * 7) % 251);
  return s;
}

void write_bytes(const fs::path& path, std::string_view bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void write_tensor(const fs::path& dir, const std::string& name, const at::Tensor& t) {
  at::Tensor c = t.contiguous().cpu();
  std::string shape;
  for (auto d : c.sizes()) {
    if (!shape.empty()) shape += ',';
    shape += std::to_string(d);
  }
  write_bytes(dir / (name + ".shape"), shape + "\n");
  write_bytes(dir / (name + ".bin"),
              std::string_view(static_cast<const char*>(c.data_ptr()), c.nbytes()));
}

int collectives(ddprun::ProcessGroup& pg, const fs::path& out) {
  const int rank = pg.rank();
  const fs::path dir = out / ("rank" + std::to_string(rank));
  fs::create_directories(dir);
  const auto n = [](const char* prefix, size_t i) { return prefix + std::to_string(i); };

  std::vector<std::string> strings;
  ddprun::all_gather_object(pg, strings, std::string(rank == 0 ? "" : "rank one, longer"));
  for (size_t i = 0; i < strings.size(); ++i) write_bytes(dir / (n("ag_str_", i) + ".bin"), strings[i]);

  ddprun::all_gather_object(pg, strings, rank == 0 ? big_object() : std::string(10, 'x'));
  for (size_t i = 0; i < strings.size(); ++i) write_bytes(dir / (n("ag_big_", i) + ".bin"), strings[i]);

  std::vector<at::Tensor> tensors;
  ddprun::all_gather_object(pg, tensors,
                            torch::arange((rank + 1) * 3, torch::kDouble).reshape({rank + 1, 3}));
  for (size_t i = 0; i < tensors.size(); ++i) write_tensor(dir, n("ag_t_", i), tensors[i]);

  std::vector<std::string> list;
  if (rank == 1) list = {"a", "", big_object()};
  ddprun::broadcast_object_list(pg, list, 1);
  for (size_t i = 0; i < list.size(); ++i) write_bytes(dir / (n("bc_", i) + ".bin"), list[i]);

  std::vector<std::string> gathered;
  ddprun::gather_object(pg, std::string(rank == 0 ? "from zero" : ""), &gathered, 1);
  for (size_t i = 0; i < gathered.size(); ++i) write_bytes(dir / (n("g_", i) + ".bin"), gathered[i]);

  std::vector<std::vector<at::Tensor>> lists;
  ddprun::gather_object(pg, std::vector<at::Tensor>{torch::ones({rank + 1}), torch::full({2, 2}, static_cast<float>(rank))},
                        rank == 1 ? &lists : nullptr, 1);
  for (size_t i = 0; i < lists.size(); ++i) {
    for (size_t j = 0; j < lists[i].size(); ++j) {
      write_tensor(dir, n("g_t_", i) + "_" + std::to_string(j), lists[i][j]);
    }
  }

  const std::pair<const char*, ddprun::ReduceOp> ops[] = {{"sum", ddprun::ReduceOp::kSum},
                                                          {"min", ddprun::ReduceOp::kMin},
                                                          {"max", ddprun::ReduceOp::kMax},
                                                          {"product", ddprun::ReduceOp::kProduct}};
  for (const auto& [name, op] : ops) {
    auto t = torch::tensor({rank + 1.5, -(rank + 1) * 2.0, std::pow(3.0, rank)}, torch::kFloat);
    pg.reduce(t, 0, op);
    if (rank == 0) write_tensor(dir, std::string("red_") + name, t);
  }
  pg.barrier(std::chrono::seconds(60));
  return 0;
}

int barrier_timeout(ddprun::ProcessGroup& pg) {
  auto store = pg.store();
  if (pg.rank() == 1) {  // never arrives; leaves once rank 0 has seen the timeout
    store->wait({"rank0_failed"}, std::chrono::seconds(60));
    return 0;
  }
  try {
    pg.barrier(std::chrono::milliseconds(500));
  } catch (const ddprun::Error&) {
    store->set("rank0_failed", std::vector<uint8_t>{1});
    throw;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ddprun::record([&] {
    if (argc != 2) throw ddprun::Error("usage: object_collectives_worker OUT|--barrier-timeout");
    ddprun::InitOptions o;
    o.backend = ddprun::Backend::kGloo;
    o.timeout = std::chrono::seconds(120);
    auto pg = ddprun::init_process_group(o);
    const std::string arg = argv[1];
    return arg == "--barrier-timeout" ? barrier_timeout(*pg) : collectives(*pg, arg);
  });
}
