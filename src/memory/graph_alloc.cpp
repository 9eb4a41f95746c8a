#include "memory/graph_alloc.h"

#include <algorithm>
#include <limits>

namespace spillway::memory {

namespace {

uint64_t Align(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// ggml_dyn_tallocr with one chunk (no backend here limits a buffer's size):
// free blocks sorted by offset, the last one the open-ended tail.
class DynAllocator {
 public:
  explicit DynAllocator(uint64_t alignment) : alignment_(alignment) {
    blocks_.push_back({0, std::numeric_limits<uint64_t>::max() / 2});
  }

  uint64_t Alloc(uint64_t size) {
    size = Align(size, alignment_);
    // Best fit among all blocks but the tail; ties go to the later block.
    size_t best = blocks_.size() - 1;
    uint64_t best_size = std::numeric_limits<uint64_t>::max();
    for (size_t i = 0; i + 1 < blocks_.size(); ++i) {
      if (blocks_[i].size >= size && blocks_[i].size <= best_size) best = i, best_size = blocks_[i].size;
    }
    const uint64_t offset = blocks_[best].offset;
    blocks_[best].offset += size;
    blocks_[best].size -= size;
    if (blocks_[best].size == 0) blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(best));
    max_size_ = std::max(max_size_, offset + size);
    return offset;
  }

  void Free(uint64_t offset, uint64_t size) {
    size = Align(size, alignment_);
    for (size_t i = 0; i < blocks_.size(); ++i) {
      Block& b = blocks_[i];
      if (b.offset + b.size == offset) {  // ends where the freed bytes start
        b.size += size;
        if (i + 1 < blocks_.size() && b.offset + b.size == blocks_[i + 1].offset) {
          b.size += blocks_[i + 1].size;
          blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(i + 1));
        }
        return;
      }
      if (offset + size == b.offset) {  // starts where the freed bytes end
        b.offset = offset;
        b.size += size;
        if (i > 0 && blocks_[i - 1].offset + blocks_[i - 1].size == b.offset) {
          blocks_[i - 1].size += b.size;
          blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(i));
        }
        return;
      }
    }
    auto at = std::find_if(blocks_.begin(), blocks_.end(), [&](const Block& b) { return b.offset >= offset; });
    blocks_.insert(at, {offset, size});
  }

  uint64_t max_size() const { return max_size_; }

 private:
  struct Block {
    uint64_t offset, size;
  };
  uint64_t alignment_;
  std::vector<Block> blocks_;
  uint64_t max_size_ = 0;
};

struct State {
  int n_children = 0, n_views = 0;
  bool allocated = false;  // the allocator's own now (ggml's "is_own")
  int buffer = 0;
  uint64_t offset = 0;
};

}  // namespace

std::vector<uint64_t> AllocateGraph(const ScheduledGraph& g, const std::vector<uint64_t>& alignment) {
  std::vector<DynAllocator> allocs;
  for (uint64_t a : alignment) allocs.emplace_back(a);
  std::vector<State> st(g.tensors.size());
  const auto& T = g.tensors;

  auto same_layout = [&](const GraphTensor& a, const GraphTensor& b) {
    return a.type_size == b.type_size && a.ne == b.ne && a.contiguous && b.contiguous;
  };
  // ggml_gallocr_allocate_node
  auto allocate = [&](int id, int buffer) {
    const GraphTensor& t = T[id];
    State& s = st[id];
    if (t.preallocated || s.allocated || t.view_src >= 0) return;
    s.allocated = true;
    // In place over a parent this node is the last reader of. A view parent
    // never qualifies: ggml asks whether the parent is the allocator's own,
    // and a view never is.
    if (t.inplace_op) {
      for (int p : t.src) {
        State& ps = st[p];
        if (!ps.allocated || T[p].output || !same_layout(t, T[p]) || ps.n_children != 1 || ps.n_views != 0) continue;
        s.buffer = ps.buffer, s.offset = ps.offset;
        ps.allocated = false;
        return;
      }
    }
    s.buffer = buffer;
    s.offset = allocs[static_cast<size_t>(buffer)].Alloc(t.bytes);
  };
  auto release = [&](int id) {  // ggml_gallocr_free_node
    if (T[id].output) return;
    allocs[static_cast<size_t>(st[id].buffer)].Free(st[id].offset, T[id].bytes);
    st[id].allocated = false;
  };

  for (int l : g.leafs) allocate(l, T[l].backend);
  for (int n : g.nodes) {
    if (T[n].view_src >= 0 && !T[n].dep) ++st[T[n].view_src].n_views;
    if (T[n].input) allocate(n, T[n].backend);
    for (int p : T[n].src) {
      ++st[p].n_children;
      if (T[p].input) allocate(p, T[n].backend);
    }
  }
  for (int n : g.nodes) {
    for (int p : T[n].src) allocate(p, T[n].backend);
    allocate(n, T[n].backend);
    for (int p : T[n].src) {
      State& ps = st[p];
      if (--ps.n_children != 0 || ps.n_views != 0) continue;
      if (T[p].view_src >= 0) {
        State& vs = st[T[p].view_src];
        if (--vs.n_views == 0 && vs.n_children == 0 && vs.allocated) release(T[p].view_src);
      } else if (ps.allocated) {
        release(p);
      }
    }
  }
  std::vector<uint64_t> sizes;
  for (const auto& a : allocs) sizes.push_back(a.max_size());
  return sizes;
}

}  // namespace spillway::memory
