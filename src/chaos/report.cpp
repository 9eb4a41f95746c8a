#include "chaos/report.h"

#include "common/utf8.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string_view>
#include <system_error>
#include <utility>

namespace spillway::chaos {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr const char* kSpillwayTarget = "spillway";

std::string Fmt(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string Fmt(const char* format, ...) {
  char buf[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  return buf;
}

std::string Mib(uint64_t bytes) { return Fmt("%.0f", bytes / 1048576.0); }
double ToMib(uint64_t bytes) { return bytes / 1048576.0; }
std::string Ms(double ms) { return Fmt("%.0f", ms); }
std::string Percent(double fraction) { return Fmt("%.1f", fraction * 100); }
std::string OutOf(int k, int n) { return std::to_string(k) + "/" + std::to_string(n); }

bool AllPassed(const std::vector<ScenarioResult>& results) {
  return !results.empty() &&
         std::all_of(results.begin(), results.end(), [](const ScenarioResult& r) { return r.verdict.passed; });
}

uint64_t DevicePeak(const ScenarioResult& r) {
  uint64_t peak = 0;
  for (const Sample& s : r.samples) peak = std::max(peak, s.device_used_bytes);
  return peak;
}

// Generated tokens per second of the run (completed requests' usage).
double TokensPerS(const ScenarioResult& r) {
  double tokens = 0;
  for (const RequestRecord& q : r.requests) tokens += q.completion_tokens > 0 ? q.completion_tokens : 0;
  return r.duration_ms > 0 ? tokens * 1000.0 / static_cast<double>(r.duration_ms) : 0;
}

// The chat service's workers together (resident set), at their highest.
uint64_t ChatRssPeak(const ScenarioResult& r) {
  uint64_t peak = 0;
  for (const Sample& s : r.samples) {
    uint64_t sum = 0;
    for (const auto& [key, bytes] : s.rss_bytes) sum += key.rfind("embed", 0) == 0 ? 0 : bytes;
    peak = std::max(peak, sum);
  }
  return peak;
}

// ---------------------------------------------------------------- Markdown

std::string MdCell(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += "\\|";
    else if (c == '\n' || c == '\r') out += ' ';
    else out += c;
  }
  return out;
}

size_t DisplayWidth(const std::string& s) {
  return std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

// A Markdown table padded to aligned columns, so that it reads in a terminal too.
// align holds one letter per column: 'l' for text, 'r' for numbers.
class MdTable {
 public:
  MdTable(std::vector<std::string> header, std::string align) : header_(std::move(header)), align_(std::move(align)) {
    align_.resize(header_.size(), 'r');
  }
  void Row(std::vector<std::string> cells) {
    for (auto& c : cells) c = MdCell(c);
    cells.resize(header_.size());
    rows_.push_back(std::move(cells));
  }
  std::string Render() const {
    std::vector<size_t> width(header_.size(), 3);
    for (size_t i = 0; i < header_.size(); ++i) width[i] = std::max(width[i], DisplayWidth(header_[i]));
    for (const auto& row : rows_)
      for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], DisplayWidth(row[i]));
    std::string out = Line(header_, width) + "|";
    for (size_t i = 0; i < width.size(); ++i) {
      out += align_[i] == 'l' ? std::string(width[i] + 2, '-') : std::string(width[i] + 1, '-') + ":";
      out += "|";
    }
    out += "\n";
    for (const auto& row : rows_) out += Line(row, width);
    return out;
  }

 private:
  std::string Line(const std::vector<std::string>& cells, const std::vector<size_t>& width) const {
    std::string out = "|";
    for (size_t i = 0; i < cells.size(); ++i) {
      std::string pad(width[i] - DisplayWidth(cells[i]), ' ');
      out += ' ';
      out += align_[i] == 'l' ? cells[i] + pad : pad + cells[i];
      out += " |";
    }
    return out + "\n";
  }

  std::vector<std::string> header_;
  std::string align_;
  std::vector<std::vector<std::string>> rows_;
};

std::string Ratio(double num, double den, bool usable) {
  if (!usable || den <= 0 || !std::isfinite(num / den)) return "n/a";
  return Fmt("%.2fx", num / den);
}

void SpillwaySection(const std::vector<ScenarioResult>& spillway, std::string& out) {
  MdTable t({"scenario", "verdict", "sent", "success %", "lost", "failed (after start)", "unknown", "dup", "retried 1x/n", "tokens equal",
             "degraded signalled", "p50 ms", "p95 ms", "queue age max ms", "host RAM peak (RSS)/budget MiB", "faults fired/armed",
             "recovery med/max ms"},
            "ll");
  for (const ScenarioResult& r : spillway) {
    const Verdict& v = r.verdict;
    std::string verdict = !r.skipped_reason.empty() ? "SKIP" : v.passed ? "PASS" : "FAIL";
    std::string ram = Mib(v.host_ram_peak_bytes) + " (" + Mib(v.host_ram_measured_peak_bytes) + ") / " +
                      (v.host_ram_budget_bytes ? Mib(v.host_ram_budget_bytes) : "-");
    std::string recovery =
        v.recovery_median_ms < 0 ? "-" : Ms(v.recovery_median_ms) + " / " + Ms(std::max(0.0, v.recovery_max_ms));
    t.Row({r.name, verdict, std::to_string(v.sent), Percent(v.success_rate), std::to_string(v.lost),
           std::to_string(v.failed_controlled) + " (" + std::to_string(v.failed_after_start) + ")", std::to_string(v.unknown), std::to_string(v.duplicates), OutOf(v.retried - v.retried_not_exactly_once, v.retried),
           OutOf(v.deterministic_equal, v.deterministic_compared), OutOf(v.degraded_signalled, v.degraded_served),
           Ms(v.p50_ms), Ms(v.p95_ms), std::to_string(v.queue_age_max_ms), ram, OutOf(v.faults_fired, v.faults_armed),
           recovery});
  }
  out += t.Render();
  out += "\nfailed (after start): ended failed or resumable / of them, failed after an attempt had run (the others "
         "were refused before any, or ended resumable with their checkpoint); retried 1x/n: retried requests that ran exactly once / all retried; tokens equal: deterministic "
         "outputs equal to the reference / compared; degraded signalled: told / served by a non-primary placement; host RAM: the CPU path's by the gateway's "
         "accounting (its workers' measured RSS); faults fired/armed: faults armed in the worker that went off / "
         "armed (kills and holds act at once).\n";

  bool any_failed = false;
  for (const ScenarioResult& r : spillway) {
    if (r.verdict.passed) continue;
    if (!any_failed) out += "\n## Failures\n";
    any_failed = true;
    out += "\n### " + r.name + (r.description.empty() ? "" : " - " + MdCell(r.description)) + "\n\n";
    if (!r.skipped_reason.empty()) out += "- skipped: " + MdCell(r.skipped_reason) + "\n";
    for (const std::string& f : r.verdict.failures) out += "- " + MdCell(f) + "\n";
    if (r.skipped_reason.empty() && r.verdict.failures.empty()) out += "- (no failure recorded by the verdict)\n";
  }

  if (!spillway.empty()) out += "\n## Plots\n\n";
  for (const ScenarioResult& r : spillway) {
    std::string f = FileNameFor(r.name);
    out += "- " + r.name + ": [latency](" + f + "-latency.svg), [memory](" + f + "-memory.svg), [queue](" + f +
           "-queue.svg)\n";
  }
}

void BaselineSection(const std::vector<ScenarioResult>& spillway, const std::vector<ScenarioResult>& baselines,
                     std::string& out) {
  out += "\n## Against baselines\n\n";
  if (baselines.empty()) {
    out += "_No baseline runs._\n";
    return;
  }
  MdTable t({"scenario", "target", "goodput/min", "p95 ms", "success %", "lost", "goodput ratio", "p95 ratio", "note"},
            "llrrrrrrl");
  auto add = [&t](const ScenarioResult& b, const ScenarioResult* s) {
    bool skipped = !b.skipped_reason.empty();
    std::string note = skipped ? "skipped: " + b.skipped_reason : s ? "" : "no Spillway run of this scenario";
    bool usable = s && !skipped && s->skipped_reason.empty();
    const Verdict& v = b.verdict;
    t.Row({b.name, b.target, skipped ? "-" : Fmt("%.1f", v.goodput_per_min), skipped ? "-" : Ms(v.p95_ms),
           skipped ? "-" : Percent(v.success_rate), skipped ? "-" : std::to_string(v.lost),
           Ratio(s ? s->verdict.goodput_per_min : 0, v.goodput_per_min, usable),
           // (A p95 of 0 is no successes, not a fast run: no ratio, which would read as Spillway's favour.)
           Ratio(s ? s->verdict.p95_ms : 0, v.p95_ms, usable && s->verdict.succeeded > 0), note});
  };
  std::set<std::string> matched;
  for (const ScenarioResult& s : spillway) {
    bool first = true;
    for (const ScenarioResult& b : baselines) {
      if (b.name != s.name) continue;
      if (first) {
        const Verdict& v = s.verdict;
        t.Row({s.name, kSpillwayTarget, Fmt("%.1f", v.goodput_per_min), Ms(v.p95_ms), Percent(v.success_rate),
               std::to_string(v.lost), "-", "-", s.skipped_reason.empty() ? "" : "skipped: " + s.skipped_reason});
        first = false;
      }
      add(b, &s);
      matched.insert(s.name);
    }
  }
  for (const ScenarioResult& b : baselines)
    if (!matched.count(b.name)) add(b, nullptr);
  out += t.Render();
  out += "\nRatios are Spillway / baseline: a goodput ratio above 1 and a p95 ratio below 1 favour Spillway.\n";
}

// Services competing for one device: the interactive service alone and under
// batch pressure, the total goodput and the evictions, per target.
void CompetingSection(const std::vector<ScenarioResult>& spillway, const std::vector<ScenarioResult>& baselines,
                      std::string& out) {
  std::vector<const ScenarioResult*> rows;
  for (const auto* v : {&spillway, &baselines})
    for (const ScenarioResult& r : *v)
      if (r.verdict.interactive_alone + r.verdict.interactive_pressure > 0 || r.verdict.evictions > 0) rows.push_back(&r);
  if (rows.empty()) return;
  out += "\n## Services competing for one device\n\n";
  MdTable t({"scenario", "target", "chat p95 alone ms", "chat p95 under batch ms", "ratio", "goodput/min", "success %",
             "lost", "evictions (unloaded)"},
            "ll");
  for (const ScenarioResult* r : rows) {
    const Verdict& v = r->verdict;
    auto ms = [](double x) { return x < 0 ? std::string("-") : Ms(x); };
    t.Row({r->name, r->target, ms(v.interactive_p95_alone_ms) + " (" + std::to_string(v.interactive_alone) + ")",
           ms(v.interactive_p95_pressure_ms) + " (" + std::to_string(v.interactive_pressure) + ")",
           Ratio(v.interactive_p95_pressure_ms, v.interactive_p95_alone_ms, v.interactive_p95_alone_ms > 0) +
               (v.interactive_ratio_lower >= 0 ? Fmt(" (>= %.2fx)", v.interactive_ratio_lower) : ""),
           Fmt("%.1f", v.goodput_per_min), Percent(v.success_rate), std::to_string(v.lost),
           std::to_string(v.evictions) + " (" + std::to_string(v.evictions_completed) + ")"});
  }
  out += t.Render();
  for (const ScenarioResult* r : rows) {
    const Verdict& v = r->verdict;
    if (v.interactive_in_stalls + v.interactive_in_stalls_pressure == 0) continue;
    out += "\n" + r->target + ": " + std::to_string(v.interactive_in_stalls) + " chat request(s) alone and " +
           std::to_string(v.interactive_in_stalls_pressure) + " under batch pressure overlapped a host stall (the run had " +
           std::to_string(r->stalls.size()) + "; the harness's own 10 ms timer woke at least " + std::to_string(kStallMs) +
           " ms late) and are left out of the p95s.\n";
  }
  out += "\nchat p95: its completed requests that overlapped no slice of batch traffic, and those that overlapped one "
         "(how many in brackets; the run alternates slices alone and under batch pressure); "
         "goodput counts every service's completed requests. swap-all is llama-swap's policy on the same gateway: "
         "one service on the device at a time, no priorities, no CPU paths.\n";
}

void ProfileSection(const std::vector<ScenarioResult>& profiles, std::string& out) {
  out += "\n## Placement profiles\n\n";
  if (profiles.empty()) {
    out += "_No placement profiles._\n";
    return;
  }
  MdTable t({"profile", "scenario", "requests", "success %", "p50 ms", "p95 ms", "goodput/min", "tokens/s",
             "chat RSS peak MiB", "device peak MiB", "note"},
            "llrrrrrrrrl");
  for (const ScenarioResult& p : profiles) {
    const Verdict& v = p.verdict;
    t.Row({p.target, p.name, std::to_string(p.requests.size()), Percent(v.success_rate), Ms(v.p50_ms), Ms(v.p95_ms),
           Fmt("%.1f", v.goodput_per_min), Fmt("%.1f", TokensPerS(p)), Mib(ChatRssPeak(p)), Mib(DevicePeak(p)),
           p.skipped_reason.empty() ? "" : "skipped: " + p.skipped_reason});
  }
  out += t.Render();
}

// ---------------------------------------------------------------- SVG

std::string XmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // Control characters other than tab and newline are not allowed in XML 1.0.
        out += (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') ? '?' : c;
    }
  }
  return out;
}

constexpr int kWidth = 960, kPanelHeight = 340;
constexpr int kLeft = 70, kRight = kWidth - 200, kTop = 36, kBottom = kPanelHeight - 48;
constexpr const char* kFaultColour = "#d62728";
const char* const kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"};

enum class Style { kDots, kRings, kLine, kStep, kArea };

struct Series {
  std::string name, colour;
  Style style = Style::kLine;
  bool dashed = false;
  std::vector<std::pair<double, double>> points;
  std::vector<std::pair<double, double>> base;  // kArea: the lower edge, same x as points (the layer below's top)
};

struct Axis {
  double lo, hi, step;
  // Rounds [lo, hi] out to multiples of a 1/2/5 step giving about five intervals.
  static Axis Nice(double lo, double hi) {
    if (!(hi > lo)) hi = lo + 1;
    double raw = (hi - lo) / 5, mag = std::pow(10, std::floor(std::log10(raw))), f = raw / mag;
    double step = (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
    return {std::floor(lo / step) * step, std::ceil(hi / step - 1e-9) * step, step};
  }
  std::string Label(double v) const {
    int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
    if (std::fabs(v) < step * 1e-6) v = 0;
    return Fmt("%.*f", decimals, v);
  }
};

// One panel (kWidth x kPanelHeight) of a line/scatter chart: axes with ticks and
// labels, a legend on the right and vertical dashed markers (faults).
class Chart {
 public:
  Chart(std::string title, std::string x_label, std::string y_label)
      : title_(std::move(title)), x_label_(std::move(x_label)), y_label_(std::move(y_label)) {}

  void Add(Series s) { series_.push_back(std::move(s)); }
  void Mark(double x, std::string label) { markers_.emplace_back(x, std::move(label)); }
  void MarkersAre(std::string name) { marker_name_ = std::move(name); }
  void IncludeX(double x) { x_min_extent_ = std::max(x_min_extent_, x); }

  std::string Render() const {
    std::string out = Text(kLeft, 22, XmlEscape(title_), "font-size=\"14\" font-weight=\"bold\"");
    out += Fmt("<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#999\"/>\n", kLeft, kTop,
               kRight - kLeft, kBottom - kTop);
    double x_lo = 0, x_hi = x_min_extent_, y_lo = 0, y_hi = 0;
    size_t n = 0;
    for (const Series& s : series_)
      for (const auto& [x, y] : s.points) {
        if (!std::isfinite(x) || !std::isfinite(y)) continue;
        x_lo = std::min(x_lo, x), x_hi = std::max(x_hi, x), y_lo = std::min(y_lo, y), y_hi = std::max(y_hi, y);
        ++n;
      }
    if (n == 0) return out + Text((kLeft + kRight) / 2, (kTop + kBottom) / 2, "no data", "text-anchor=\"middle\"");
    for (const auto& m : markers_) x_hi = std::max(x_hi, m.first);
    const Axis xa = Axis::Nice(x_lo, x_hi), ya = Axis::Nice(y_lo, y_hi * 1.05);
    auto px = [&](double x) { return kLeft + (x - xa.lo) / (xa.hi - xa.lo) * (kRight - kLeft); };
    auto py = [&](double y) { return kBottom - (y - ya.lo) / (ya.hi - ya.lo) * (kBottom - kTop); };

    for (double v = xa.lo; v <= xa.hi + xa.step * 1e-6; v += xa.step) {
      out += Fmt("<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#999\"/>\n", px(v), kBottom, px(v), kBottom + 5);
      out += Text(px(v), kBottom + 18, xa.Label(v), "text-anchor=\"middle\"");
    }
    for (double v = ya.lo; v <= ya.hi + ya.step * 1e-6; v += ya.step) {
      out += Fmt("<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>\n", kLeft, py(v), kRight, py(v));
      out += Text(kLeft - 6, py(v) + 4, ya.Label(v), "text-anchor=\"end\"");
    }
    out += Text((kLeft + kRight) / 2, kBottom + 38, XmlEscape(x_label_), "text-anchor=\"middle\"");
    out += Fmt("<text transform=\"translate(16,%d) rotate(-90)\" text-anchor=\"middle\">%s</text>\n",
               (kTop + kBottom) / 2, XmlEscape(y_label_).c_str());

    for (const Series& s : series_) out += Plot(s, px, py);
    out += Markers(px);
    return out + Legend();
  }

 private:
  static std::string Text(double x, double y, const std::string& escaped, const char* attrs = "") {
    return Fmt("<text x=\"%.1f\" y=\"%.1f\" %s>", x, y, attrs) + escaped + "</text>\n";
  }
  static std::string Stroke(const Series& s) {
    return "stroke=\"" + s.colour + "\"" + (s.dashed ? " stroke-dasharray=\"6 4\"" : "");
  }

  template <typename Px, typename Py>
  static std::string Plot(const Series& s, const Px& px, const Py& py) {
    std::string out, points;
    double prev_y = 0;
    bool first = true;
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      if (s.style == Style::kDots || s.style == Style::kRings) {
        out += Fmt("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" ", px(x), py(y)) +
               (s.style == Style::kDots ? "fill=\"" + s.colour + "\" fill-opacity=\"0.75\"/>\n"
                                        : "fill=\"none\" stroke=\"" + s.colour + "\"/>\n");
        continue;
      }
      if (s.style == Style::kStep && !first) points += Fmt("%.1f,%.1f ", px(x), py(prev_y));
      points += Fmt("%.1f,%.1f ", px(x), py(y));
      prev_y = y, first = false;
    }
    if (points.empty()) return out;
    if (s.style == Style::kArea) {
      for (auto it = s.base.rbegin(); it != s.base.rend(); ++it) {
        if (std::isfinite(it->first) && std::isfinite(it->second)) points += Fmt("%.1f,%.1f ", px(it->first), py(it->second));
      }
      points.pop_back();
      return out + "<polygon fill=\"" + s.colour + "\" fill-opacity=\"0.6\" stroke=\"" + s.colour + "\" points=\"" +
             points + "\"/>\n";
    }
    points.pop_back();
    return out + "<polyline fill=\"none\" stroke-width=\"1.5\" " + Stroke(s) + " points=\"" + points + "\"/>\n";
  }

  // Dashed red lines; labels run down along the line, and markers closer than
  // 12 px share one label so that the labels do not overlap.
  template <typename Px>
  std::string Markers(const Px& px) const {
    std::vector<std::pair<double, std::string>> sorted = markers_;
    std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::string out, label;
    double group_x = 0, last_x = 0;  // the first and the last line of the group a label stands for
    auto flush = [&] {
      if (label.empty()) return;
      out += Fmt("<text transform=\"translate(%.1f,%d) rotate(90)\" font-size=\"10\" fill=\"%s\" "
                 "stroke=\"white\" stroke-width=\"3\" paint-order=\"stroke\">",
                 last_x + 3, kTop + 4, kFaultColour) +
             XmlEscape(Abbreviated(label, (kBottom - kTop - 8) / 6)) + "</text>\n";
    };
    for (const auto& [x, text] : sorted) {
      double p = px(x);
      out += Fmt("<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"%s\" stroke-dasharray=\"4 3\">", p, kTop,
                 p, kBottom, kFaultColour) +
             "<title>" + XmlEscape(Fmt("%.1f s: ", x) + text) + "</title></line>\n";
      if (!label.empty() && p - group_x < 12) {
        label += " + " + text, last_x = p;
        continue;
      }
      flush();
      label = text, group_x = last_x = p;
    }
    flush();
    return out;
  }

  std::string Legend() const {
    std::string out;
    int y = kTop + 10;
    auto entry = [&](const Series& s) {
      if (s.style == Style::kArea)
        out += Fmt("<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"10\" fill-opacity=\"0.6\" fill=\"", kRight + 17, y - 9) +
               s.colour + "\"/>\n";
      else if (s.style == Style::kDots || s.style == Style::kRings)
        out += Fmt("<circle cx=\"%d\" cy=\"%d\" r=\"4\" ", kRight + 24, y - 4) +
               (s.style == Style::kDots ? "fill=\"" + s.colour + "\"/>\n" : "fill=\"none\" stroke=\"" + s.colour + "\"/>\n");
      else
        out += Fmt("<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke-width=\"2\" ", kRight + 14, y - 4, kRight + 34,
                   y - 4) + Stroke(s) + "/>\n";
      out += Text(kRight + 40, y, XmlEscape(Abbreviated(s.name, 24)), "font-size=\"11\"");
      y += 18;
    };
    for (const Series& s : series_) entry(s);
    if (!markers_.empty()) entry(Series{marker_name_, kFaultColour, Style::kLine, true, {}, {}});
    return out;
  }

  std::string title_, x_label_, y_label_;
  std::vector<Series> series_;
  std::vector<std::pair<double, std::string>> markers_;
  std::string marker_name_ = "fault injected";
  double x_min_extent_ = 0;
};

std::string Document(const std::vector<Chart>& panels) {
  const int height = kPanelHeight * static_cast<int>(panels.size());
  std::string out = Fmt(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      kWidth, height, kWidth, height);
  for (size_t i = 0; i < panels.size(); ++i)
    out += Fmt("<g transform=\"translate(0,%d)\">\n", kPanelHeight * static_cast<int>(i)) + panels[i].Render() + "</g>\n";
  return out + "</svg>\n";
}

Chart TimeChart(const std::string& title, const ScenarioResult& r, const std::string& x_label,
                const std::string& y_label) {
  Chart c(title + " - " + r.name + (r.target.empty() || r.target == kSpillwayTarget ? "" : " (" + r.target + ")"),
          x_label, y_label);
  c.IncludeX(r.duration_ms / 1000.0);
  for (const FaultEvent& f : r.faults) c.Mark(f.at_ms / 1000.0, f.kind + (f.fired == false ? " (did not go off)" : ""));
  return c;
}

void AddNonEmpty(Chart& c, Series s) {
  if (!s.points.empty()) c.Add(std::move(s));
}

// ---------------------------------------------------------------- files

Status WriteText(const fs::path& path, const std::string& text) {
  fs::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return Status::Internal("cannot write " + tmp.string());
    f << text;
    f.close();
    if (!f) return Status::Internal("cannot write " + tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return Status::Internal("cannot rename " + tmp.string() + " to " + path.string() + ": " + ec.message());
  return Status::Ok();
}

Status MakeDir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::Internal("cannot create " + dir + ": " + ec.message());
  return Status::Ok();
}

// Model output is arbitrary bytes: invalid UTF-8 is replaced instead of throwing.
std::string Dump(const json& j) { return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n"; }

}  // namespace

std::string MarkdownSummary(const std::vector<ScenarioResult>& spillway, const std::vector<ScenarioResult>& baselines,
                            const std::vector<ScenarioResult>& profiles, uint64_t seed) {
  const std::string seed_text = std::to_string(seed);
  std::string out = "# Spillway chaos report, seed " + seed_text + "\n\nReplay: `spillway chaos --seed " + seed_text +
                    "`\n\n";
  size_t passed = std::count_if(spillway.begin(), spillway.end(), [](const ScenarioResult& r) { return r.verdict.passed; });
  out += std::string("**Overall: ") + (AllPassed(spillway) ? "PASS" : "FAIL") + "** - " + std::to_string(passed) + "/" +
         std::to_string(spillway.size()) + " scenarios passed\n\n## Spillway\n\n";
  SpillwaySection(spillway, out);
  BaselineSection(spillway, baselines, out);
  CompetingSection(spillway, baselines, out);
  ProfileSection(profiles, out);
  return out;
}

json ReportJson(const std::vector<ScenarioResult>& spillway, const std::vector<ScenarioResult>& baselines,
                const std::vector<ScenarioResult>& profiles, uint64_t seed) {
  auto all = [](const std::vector<ScenarioResult>& v) {
    json a = json::array();
    for (const ScenarioResult& r : v) a.push_back(ToJson(r));
    return a;
  };
  return {{"seed", seed},
          {"replay", "spillway chaos --seed " + std::to_string(seed)},
          {"passed", AllPassed(spillway)},
          {"spillway", all(spillway)},
          {"baselines", all(baselines)},
          {"profiles", all(profiles)}};
}

std::string LatencySvg(const ScenarioResult& r) {
  Chart c = TimeChart("Latency per request", r, "time sent (s)", "latency (ms)");
  Series primary{"succeeded (primary)", kPalette[0], Style::kDots, false, {}, {}};
  Series degraded{"succeeded (degraded)", kPalette[1], Style::kDots, false, {}, {}};
  Series failed{"failed", kPalette[3], Style::kDots, false, {}, {}};
  Series cancelled{"cancelled by client", "#7f7f7f", Style::kDots, false, {}, {}};
  Series lost{"never ended (at top)", "#000000", Style::kRings, false, {}, {}};
  int64_t top = 0;
  for (const RequestRecord& q : r.requests) top = std::max(top, q.latency_ms);
  for (const RequestRecord& q : r.requests) {
    double x = q.sent_ms / 1000.0;
    bool succeeded = q.http_status >= 200 && q.http_status < 300 && q.connection_survived;
    if (q.cancelled_by_client) cancelled.points.emplace_back(x, std::max<int64_t>(q.latency_ms, 0));
    else if (q.latency_ms < 0) lost.points.emplace_back(x, top > 0 ? top * 1.05 : 1.0);
    else if (succeeded) (q.degraded_signal ? degraded : primary).points.emplace_back(x, q.latency_ms);
    else failed.points.emplace_back(x, q.latency_ms);
  }
  for (Series* s : {&primary, &degraded, &failed, &cancelled, &lost}) AddNonEmpty(c, std::move(*s));
  return Document({c});
}

std::string MemorySvg(const ScenarioResult& r) {
  Chart device = TimeChart("Device memory", r, "time (s)", "MiB");
  Chart host = TimeChart("Host RAM", r, "time (s)", "MiB");
  Series used{"device used", kPalette[0], Style::kLine, false, {}, {}};
  Series capacity{"device capacity", "#555555", Style::kLine, true, {}, {}};
  Series cpu_path{"CPU path accounted", kPalette[2], Style::kLine, false, {}, {}};
  Series budget{"CPU path budget", "#000000", Style::kLine, true, {}, {}};
  std::map<std::string, Series> rss;
  bool any_capacity = false, any_budget = false;
  for (const Sample& s : r.samples) {
    double t = s.t_ms / 1000.0;
    used.points.emplace_back(t, ToMib(s.device_used_bytes));
    capacity.points.emplace_back(t, ToMib(s.device_capacity_bytes));
    cpu_path.points.emplace_back(t, ToMib(s.cpu_path_ram_bytes));
    budget.points.emplace_back(t, ToMib(s.cpu_path_budget_bytes));
    any_capacity |= s.device_capacity_bytes > 0, any_budget |= s.cpu_path_budget_bytes > 0;
    for (const auto& [key, bytes] : s.rss_bytes) {
      Series& line = rss[key];
      line.points.emplace_back(t, ToMib(bytes));
    }
  }
  AddNonEmpty(device, std::move(used));
  if (any_capacity) device.Add(std::move(capacity));
  size_t i = 0;
  for (auto& [key, line] : rss) {
    line.name = "RSS " + key;
    line.colour = kPalette[(3 + i++) % std::size(kPalette)];
    host.Add(std::move(line));
  }
  AddNonEmpty(host, std::move(cpu_path));
  if (any_budget) host.Add(std::move(budget));
  // Several services on the device (competing_services): each one's bytes stacked, the evictions marked.
  std::vector<std::string> names;
  for (const Sample& s : r.samples)
    for (const auto& [name, bytes] : s.service_device_bytes)
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  if (names.empty()) return Document({device, host});
  Chart stacked("Device memory by service (stacked) - " + r.name + (r.target == kSpillwayTarget ? "" : " (" + r.target + ")"),
                "time (s)", "MiB");
  stacked.IncludeX(r.duration_ms / 1000.0);
  stacked.MarkersAre("eviction");
  for (const ResidencyEvent& e : r.events) {
    if (e.kind == "evict") stacked.Mark(e.at_ms / 1000.0, "evict " + e.service + " for " + e.for_service);
  }
  std::vector<double> below(r.samples.size(), 0);
  for (size_t n = 0; n < names.size(); ++n) {
    Series layer{names[n], kPalette[n % std::size(kPalette)], Style::kArea, false, {}, {}};
    for (size_t i = 0; i < r.samples.size(); ++i) {
      const double t = r.samples[i].t_ms / 1000.0;
      auto it = r.samples[i].service_device_bytes.find(names[n]);
      const double top = below[i] + (it == r.samples[i].service_device_bytes.end() ? 0 : ToMib(it->second));
      layer.base.emplace_back(t, below[i]);
      layer.points.emplace_back(t, top);
      below[i] = top;
    }
    stacked.Add(std::move(layer));
  }
  Series cap{"device capacity", "#555555", Style::kLine, true, {}, {}};
  for (const Sample& s : r.samples) cap.points.emplace_back(s.t_ms / 1000.0, ToMib(s.device_capacity_bytes));
  if (any_capacity) stacked.Add(std::move(cap));
  return Document({stacked, device, host});
}

std::string QueueSvg(const ScenarioResult& r) {
  Chart c = TimeChart("CPU queue", r, "time (s)", "requests");
  Series waiting{"waiting", kPalette[1], Style::kStep, false, {}, {}};
  Series running{"running", kPalette[0], Style::kStep, false, {}, {}};
  for (const Sample& s : r.samples) {
    waiting.points.emplace_back(s.t_ms / 1000.0, s.cpu_queue_waiting);
    running.points.emplace_back(s.t_ms / 1000.0, s.cpu_queue_running);
  }
  AddNonEmpty(c, std::move(waiting));
  AddNonEmpty(c, std::move(running));
  return Document({c});
}

std::string FileNameFor(const std::string& name) {
  std::string out;
  for (char c : name) {
    char l = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    bool ok = (l >= 'a' && l <= 'z') || (l >= '0' && l <= '9') || l == '_' || l == '-';
    out += ok ? l : '_';
  }
  return out.empty() ? "scenario" : out;
}

Status WriteScenario(const std::string& dir, const ScenarioResult& r) {
  SPILLWAY_RETURN_IF_ERROR(MakeDir(dir));
  std::string base = FileNameFor(r.name);
  if (!r.target.empty() && r.target != kSpillwayTarget) base += "-" + FileNameFor(r.target);
  return WriteText(fs::path(dir) / (base + ".json"), Dump(ToJson(r)));
}

Status WriteReport(const std::string& dir, const std::vector<ScenarioResult>& spillway,
                   const std::vector<ScenarioResult>& baselines, const std::vector<ScenarioResult>& profiles,
                   uint64_t seed) {
  SPILLWAY_RETURN_IF_ERROR(MakeDir(dir));
  const fs::path root(dir);
  SPILLWAY_RETURN_IF_ERROR(WriteText(root / "summary.md", MarkdownSummary(spillway, baselines, profiles, seed)));
  SPILLWAY_RETURN_IF_ERROR(WriteText(root / "report.json", Dump(ReportJson(spillway, baselines, profiles, seed))));
  for (const ScenarioResult& r : spillway) {
    const std::string base = FileNameFor(r.name);
    SPILLWAY_RETURN_IF_ERROR(WriteText(root / (base + "-latency.svg"), LatencySvg(r)));
    SPILLWAY_RETURN_IF_ERROR(WriteText(root / (base + "-memory.svg"), MemorySvg(r)));
    SPILLWAY_RETURN_IF_ERROR(WriteText(root / (base + "-queue.svg"), QueueSvg(r)));
  }
  return Status::Ok();
}

}  // namespace spillway::chaos
