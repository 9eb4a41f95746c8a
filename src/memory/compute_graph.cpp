#include "memory/compute_graph.h"

#include "memory/compute_model.h"

#include <algorithm>
#include <map>
#include <utility>

namespace spillway::memory {

namespace {

using Shape = std::array<int64_t, 4>;

// Builds tensors, lists them as ggml_build_forward_expand does (sources
// depth-first, left to right; op-less tensors as leaves) and schedules them.
class GraphBuilder {
 public:
  int Weight(int backend) { return Leaf({1, 1, 1, 1}, 4, backend, true); }
  int Cache(int backend) { return Leaf({1, 1, 1, 1}, 2, backend, false); }
  int Input(Shape ne, int type_size) {
    int id = Leaf(ne, type_size, kHostBackend, false);
    t_[id].preallocated = false;
    t_[id].input = true;
    t_[id].bytes = Elements(ne) * static_cast<uint64_t>(type_size);
    return id;
  }
  // An op with an F32 (or `type_size`) result of shape `ne`.
  int Op(Shape ne, std::vector<int> src, bool inplace = false, int type_size = 4) {
    GraphTensor t;
    t.ne = ne, t.type_size = type_size, t.bytes = Elements(ne) * static_cast<uint64_t>(type_size);
    t.src = std::move(src), t.inplace_op = inplace;
    return Add(std::move(t), false, false);
  }
  int Rope(int x, int pos) {
    int id = Op(t_[x].ne, {x, pos}, true);
    pins_weight_[static_cast<size_t>(id)] = false;  // ROPE/flash attention never follow a weight
    return id;
  }
  // Flash attention: never placed by a weight either.
  int FlashAttn(Shape ne, std::vector<int> src) {
    int id = Op(ne, std::move(src));
    pins_weight_[static_cast<size_t>(id)] = false;
    return id;
  }
  // RESHAPE/VIEW/PERMUTE: memory of the viewed tensor (always the root).
  int View(int of, Shape ne, bool contiguous = true) {
    GraphTensor t;
    t.ne = ne, t.contiguous = contiguous, t.view_op = true, t.type_size = t_[of].type_size;
    t.bytes = Elements(ne) * static_cast<uint64_t>(t.type_size);  // what a copy of it to another device takes
    t.view_src = Root(of), t.src = {of};
    return Add(std::move(t), false, false);
  }
  // SET_ROWS into a KV cache: an op whose result is a view of the cache.
  int StoreRows(int rows, int idxs, int dst) {
    GraphTensor t;
    t.view_src = Root(dst), t.src = {rows, idxs, dst};
    return Add(std::move(t), false, false);
  }
  void SetOutput(int id) { t_[id].output = true; }
  void Expand(int id);
  ScheduledGraph Schedule();

  static uint64_t Elements(const Shape& ne) {
    return static_cast<uint64_t>(ne[0] * ne[1] * ne[2] * ne[3]);
  }
  const GraphTensor& operator[](int id) const { return t_[id]; }

 private:
  int Leaf(Shape ne, int type_size, int backend, bool weight) {
    GraphTensor t;
    t.ne = ne, t.type_size = type_size, t.backend = backend, t.preallocated = true;
    return Add(std::move(t), true, weight);
  }
  int Add(GraphTensor t, bool leaf, bool weight) {
    t_.push_back(std::move(t));
    is_leaf_.push_back(leaf);
    is_weight_.push_back(weight);
    pins_weight_.push_back(true);
    visited_.push_back(false);
    return static_cast<int>(t_.size()) - 1;
  }
  int Root(int id) const { return t_[id].view_src >= 0 ? t_[id].view_src : id; }
  void Assign();
  void Expand(bool down, bool skip_host);

  std::vector<GraphTensor> t_;
  std::vector<bool> is_leaf_, is_weight_, pins_weight_, visited_;
  std::vector<int> leafs_, nodes_;
};

void GraphBuilder::Expand(int id) {
  if (visited_[static_cast<size_t>(id)]) return;
  visited_[static_cast<size_t>(id)] = true;
  for (int s : t_[id].src) Expand(s);
  (is_leaf_[static_cast<size_t>(id)] ? leafs_ : nodes_).push_back(id);
}

// ggml_backend_sched_split_graph, pass 2: spread assigned ops to their
// unassigned neighbours, the accelerator first (down, then up), then any.
void GraphBuilder::Expand(bool down, bool skip_host) {
  int cur = -1;
  const int n = static_cast<int>(nodes_.size());
  for (int k = 0; k < n; ++k) {
    GraphTensor& t = t_[nodes_[static_cast<size_t>(down ? k : n - 1 - k)]];
    if (t.view_op) continue;
    if (t.backend != -1) {
      cur = skip_host && t.backend == kHostBackend ? -1 : t.backend;
    } else if (cur != -1) {
      t.backend = cur;
    }
  }
}

// Passes 1-4: each op to its weight's device (or its preallocated buffer's);
// the rest spread from there; views with what they view.
void GraphBuilder::Assign() {
  for (int id : nodes_) {
    GraphTensor& t = t_[id];
    if (t.view_src >= 0 && t_[t.view_src].preallocated) {
      t.backend = t_[t.view_src].backend;
      continue;
    }
    if (!pins_weight_[static_cast<size_t>(id)]) continue;
    for (int s : t.src) {
      if (is_weight_[static_cast<size_t>(s)]) {
        t.backend = t_[s].backend;
        break;
      }
    }
  }
  Expand(true, true), Expand(false, true), Expand(true, false), Expand(false, false);
  for (int id : nodes_) {
    GraphTensor& t = t_[id];
    if (t.view_src >= 0 && t.backend == -1) t.backend = t_[t.view_src].backend;
    for (int s : t.src) {
      if (t_[s].backend == -1) t_[s].backend = t_[s].view_src >= 0 ? t_[t_[s].view_src].backend : t.backend;
    }
    if (t.backend == -1) t.backend = kAcceleratorBackend;
  }
}

// Pass 5 and graph_copy: splits where the device changes; an op reading a
// tensor from the other device reads a copy, made once per device and listed
// (after a dependency that keeps the original alive) at its split's start.
ScheduledGraph GraphBuilder::Schedule() {
  Assign();
  ScheduledGraph g;
  struct Split {
    int backend;
    size_t start;
    std::vector<int> inputs;
  };
  std::vector<Split> splits;
  std::map<std::pair<int, int>, int> copies;
  size_t k = 0;
  while (k < nodes_.size() && t_[nodes_[k]].view_op) ++k;
  splits.push_back({k < nodes_.size() ? t_[nodes_[k]].backend : kHostBackend, 0, {}});
  for (; k < nodes_.size(); ++k) {
    const int id = nodes_[k];
    if (t_[id].view_op) continue;
    const int backend = t_[id].backend;
    if (backend != splits.back().backend) splits.push_back({backend, k, {}});
    for (int& s : t_[id].src) {
      if (t_[s].backend == backend) continue;
      auto [it, added] = copies.try_emplace({s, backend}, -1);
      if (added) {
        GraphTensor c;
        c.bytes = t_[s].bytes, c.ne = t_[s].ne, c.type_size = t_[s].type_size, c.backend = backend;
        t_.push_back(std::move(c));
        it->second = static_cast<int>(t_.size()) - 1;
        splits.back().inputs.push_back(s);
      }
      s = it->second;
    }
  }
  for (size_t i = 0; i < splits.size(); ++i) {
    for (int in : splits[i].inputs) {
      GraphTensor dep;
      dep.dep = true, dep.view_src = t_[in].view_src >= 0 ? t_[in].view_src : in, dep.src = {in};
      dep.backend = t_[in].backend;
      t_.push_back(std::move(dep));
      g.nodes.push_back(static_cast<int>(t_.size()) - 1);
      g.nodes.push_back(copies.at({in, splits[i].backend}));
    }
    const size_t end = i + 1 < splits.size() ? splits[i + 1].start : nodes_.size();
    for (size_t j = splits[i].start; j < end; ++j) g.nodes.push_back(nodes_[j]);
  }
  g.leafs = leafs_;
  g.tensors = t_;
  return g;
}

}  // namespace

ScheduledGraph BuildScheduledGraph(const ModelShape& s, const PlacementSpec& spec, int layers_on_accelerator,
                                   bool output_on_accelerator) {
  GraphBuilder b;
  const int64_t L = s.n_layer, E = s.n_embd, H = s.n_head, HK = s.n_head_kv, F = s.n_ff, V = s.n_vocab;
  const int64_t hd = s.head_dim_k ? s.head_dim_k : E / std::max<int64_t>(H, 1);
  const int64_t slots = std::max<uint32_t>(spec.slots, 1);
  const bool fa = spec.kv_unified;  // the worker turns flash attention off without a unified pool
  const int64_t ns = fa ? 1 : slots;  // KV streams
  const int64_t n_kv = KvCells(spec) / ns;
  // Micro-batch: the outputs, then the tokens rounded up to whole sequences.
  const int64_t O = std::min<int64_t>({std::max<uint32_t>(spec.batch, 1), std::max<uint32_t>(spec.ubatch, 1),
                                       std::max<uint32_t>(spec.ctx, 1)});
  const int64_t T = (O + slots - 1) / slots * slots, Tn = T / ns;
  const bool k_quant = spec.kv_k_x32 != 64 && spec.kv_k_x32 != 128, v_quant = spec.kv_v_x32 != 64 && spec.kv_v_x32 != 128;
  const bool k_f32 = spec.kv_k_x32 == 128, v_f32 = spec.kv_v_x32 == 128;
  int64_t nrot_k = 64;
  while (hd > 0 && nrot_k < (int64_t{1} << 30) && hd % (nrot_k * 2) == 0) nrot_k *= 2;
  const int first_acc = static_cast<int>(L) - layers_on_accelerator;
  auto dev = [&](int64_t il) { return il >= first_acc ? kAcceleratorBackend : kHostBackend; };

  // Inputs, in the order the graph first reads them (that is where ggml places them).
  const int k_rot = k_quant && hd % 64 == 0 ? b.Input({nrot_k, nrot_k, 1, 1}, 4) : -1;
  const int tokens = b.Input({T, 1, 1, 1}, 4);
  const int pos = b.Input({T, 1, 1, 1}, 4);
  const int v_rot = v_quant && hd % 64 == 0 ? b.Input({64, 64, 1, 1}, 4) : -1;
  const int k_idxs = b.Input({T, 1, 1, 1}, 8);
  const int v_idxs = b.Input({fa ? T : T * hd * HK, 1, 1, 1}, 8);
  const int mask = b.Input({n_kv, Tn, 1, ns}, fa ? 2 : 4);
  const int out_ids = b.Input({O, 1, 1, 1}, 4);
  // y = rot x, blockwise (llama_mul_mat_hadamard).
  auto hadamard = [&](int x, int rot) {
    const int64_t n = b[rot].ne[0], rows = static_cast<int64_t>(GraphBuilder::Elements(b[x].ne)) / n;
    const int r = b[x].contiguous ? b.View(x, {n, rows, 1, 1}) : b.Op({n, rows, 1, 1}, {x});
    return b.View(b.Op({n, rows, 1, 1}, {rot, r}), b[x].ne);
  };

  // Token embeddings; the graph also lists the input for given embeddings
  // (ggml_build_forward_select), which the host holds throughout.
  int x = b.Op({E, T, 1, 1}, {b.Weight(kHostBackend), tokens});
  b.Expand(x), b.Expand(b.Input({E, T, 1, 1}, 4));
  for (int64_t il = 0; il < L; ++il) {
    const int w = b.Weight(dev(il)), kc = b.Cache(dev(il)), vc = b.Cache(dev(il));
    const bool last = il == L - 1;
    const int norm = b.Op({E, T, 1, 1}, {b.Op({E, T, 1, 1}, {x}, true), w}, true);
    int q = b.Rope(b.View(b.Op({hd * H, T, 1, 1}, {w, norm}), {hd, H, T, 1}), pos);
    int v = b.View(b.Op({hd * HK, T, 1, 1}, {w, norm}), {hd, HK, T, 1});
    int k = b.Rope(b.View(b.Op({hd * HK, T, 1, 1}, {w, norm}), {hd, HK, T, 1}), pos);
    if (k_rot >= 0) q = hadamard(q, k_rot), k = hadamard(k, k_rot);
    if (v_rot >= 0) v = hadamard(v, v_rot);
    b.Expand(q), b.Expand(v), b.Expand(k);
    const int64_t kv_rows = hd * HK * T;
    b.Expand(b.StoreRows(b.View(k, {hd * HK, T, 1, 1}), k_idxs, ns > 1 ? b.View(kc, {hd * HK, n_kv * ns, 1, 1}) : kc));
    if (fa) {
      b.Expand(b.StoreRows(b.View(v, {hd * HK, T, 1, 1}), v_idxs, ns > 1 ? b.View(vc, {hd * HK, n_kv * ns, 1, 1}) : vc));
    } else {  // a transposed V cache, one row per value
      const int flat = b.View(b.View(v, {hd * HK, T, 1, 1}), {1, kv_rows, 1, 1});
      b.Expand(b.StoreRows(flat, v_idxs, b.View(vc, {1, hd * HK * n_kv * ns, 1, 1})));
    }
    const int qp = b.View(b.View(q, {hd, H, Tn, ns}), {hd, Tn, H, ns}, false);
    int cur;
    if (fa) {
      const int kp = b.View(b.View(kc, {hd, HK, n_kv, ns}, false), {hd, n_kv, HK, ns}, false);
      const int vp = b.View(b.View(vc, {hd, HK, n_kv, ns}, false), {hd, n_kv, HK, ns}, false);
      const int kf = k_f32 ? b.Op({hd, n_kv, HK, ns}, {kp}, false, 2) : kp;  // F16 casts of F32 caches
      const int vf = v_f32 ? b.Op({hd, n_kv, HK, ns}, {vp}, false, 2) : vp;
      cur = b.View(b.FlashAttn({hd, H, Tn, ns}, {qp, kf, vf, mask}), {hd * H, T, 1, 1});
      if (v_rot >= 0) cur = hadamard(cur, v_rot);
    } else {
      const int vp = b.View(b.View(vc, {n_kv, HK, hd, ns}, false), {n_kv, hd, HK, ns}, false);
      const int kp = b.View(b.View(kc, {hd, HK, n_kv, ns}, false), {hd, n_kv, HK, ns}, false);
      const int kq = b.Op({n_kv, Tn, H, ns}, {kp, qp});
      const int kqv = b.Op({hd, Tn, H, ns}, {vp, b.Op({n_kv, Tn, H, ns}, {kq, mask}, true)});
      cur = b.Op({hd * H, T, 1, 1}, {b.View(kqv, {hd, H, Tn, ns}, false)});
    }
    b.Expand(cur);
    const int64_t Tc = last ? O : T;  // the last layer keeps only the outputs' rows
    int attn = b.Op({E, T, 1, 1}, {w, cur}), res = x;
    if (last) attn = b.Op({E, O, 1, 1}, {attn, out_ids}), res = b.Op({E, O, 1, 1}, {x, out_ids});
    const int ffn_inp = b.Op({E, Tc, 1, 1}, {attn, res}, true);
    const int ffn_norm = b.Op({E, Tc, 1, 1}, {b.Op({E, Tc, 1, 1}, {ffn_inp}, true), w}, true);
    const int gate = b.Op({F, Tc, 1, 1}, {w, ffn_norm}), up = b.Op({F, Tc, 1, 1}, {w, ffn_norm});
    const int down = b.Op({E, Tc, 1, 1}, {w, b.Op({F, Tc, 1, 1}, {gate, up})});
    x = b.Op({E, Tc, 1, 1}, {down, ffn_inp}, true);
  }
  const int w_out = b.Weight(output_on_accelerator ? kAcceleratorBackend : kHostBackend);
  const int result_norm = b.Op({E, O, 1, 1}, {b.Op({E, O, 1, 1}, {x}, true), w_out}, true);
  const int logits = b.Op({V, O, 1, 1}, {w_out, result_norm});
  b.SetOutput(result_norm), b.SetOutput(logits);
  b.Expand(logits);
  if (s.embedding) {  // build_pooling, mean: the outputs' rows times each sequence's weights
    const int rows = b.Op({O, E, 1, 1}, {b.View(result_norm, {O, E, 1, 1}, false)});
    const int pooled = b.Op({E, slots, 1, 1}, {rows, b.Input({T, slots, 1, 1}, 4)});
    b.SetOutput(pooled);
    b.Expand(pooled);
  }
  return b.Schedule();
}

}  // namespace spillway::memory
