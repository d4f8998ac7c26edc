// The PNG that cli/plot_timeline.py draws of a step's trace (issue 15, item 9):
// its legend lists only the kinds the step has, its labels fit inside their bars
// and never overlap, and a send of a few microseconds next to forwards of
// milliseconds still shows. The script says what it drew with --layout (in the
// PNG's pixels); these tests read that. They need a python3 with matplotlib
// ($CONVEYOR_PYTHON, python3 or /usr/bin/python3, as cli/trace.cpp looks) and
// skip without one. $CONVEYOR_PLOT_SCRIPT draws with another script, as for
// `conveyor trace`; $TIMELINE_PICTURE_OUT keeps the inputs and PNGs there.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The narrowest a bar may be drawn: below this a send does not show.
constexpr double kMinBlockPx = 1.5;
// The kinds that the picture draws; receives are its white gaps.
const std::set<std::string> kDrawnKinds = {"forward", "backward", "weight", "recompute", "optimizer", "send"};

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string Slurp(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// As cli/trace.cpp chooses: the first that can import matplotlib, or "".
std::string PythonWithMatplotlib() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("CONVEYOR_PYTHON"); env && *env) candidates.push_back(env);
  candidates.push_back("python3");
  candidates.push_back("/usr/bin/python3");
  for (const auto& py : candidates)
    if (std::system((Quote(py) + " -c 'import matplotlib' >/dev/null 2>&1").c_str()) == 0) return py;
  return "";
}

std::string PlotScript() {
  if (const char* env = std::getenv("CONVEYOR_PLOT_SCRIPT"); env && *env) return env;
  return std::string(CONVEYOR_SOURCE_DIR) + "/cli/plot_timeline.py";
}

// One complete event, as cli/trace.cpp writes it.
json Event(int stage, const std::string& cat, const std::string& name, int64_t ts, int64_t dur) {
  return {{"name", name}, {"cat", cat}, {"ph", "X"}, {"pid", 0}, {"tid", stage}, {"ts", ts}, {"dur", dur}};
}

json Trace(json events, int stages, const std::string& schedule, int micro_batches, int virtual_stages) {
  json all = json::array({{{"name", "process_name"}, {"ph", "M"}, {"pid", 0}, {"args", {{"name", "job-1"}}}}});
  for (int s = 0; s < stages; ++s)
    all.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", s},
                   {"args", {{"name", "stage " + std::to_string(s)}}}});
  for (auto& e : events) all.push_back(e);
  return {{"traceEvents", all},
          {"displayTimeUnit", "ms"},
          {"metadata",
           {{"job_id", "job-1"}, {"step", 5}, {"schedule", schedule}, {"micro_batches", micro_batches},
            {"virtual_stages", virtual_stages}, {"idle_fraction", std::vector<double>(stages, 0.3)},
            {"theoretical_idle_fraction", 0.25}}}};
}

// The MLP job's shape (2 stages, 4 micro-batches, GPipe): forwards and
// backwards of milliseconds, each followed by a send of a few microseconds.
json MlpTrace() {
  json ev = json::array();
  const int64_t f = 1500, b = 3000;
  for (int m = 0; m < 4; ++m) {
    const int64_t t = m * (f + 4);
    ev.push_back(Event(0, "forward", "F" + std::to_string(m), t, f));
    ev.push_back(Event(0, "send", "send " + std::to_string(m), t + f, 4));
  }
  ev.push_back(Event(1, "receive", "receive 0", 0, f + 10));
  for (int m = 0; m < 4; ++m)
    ev.push_back(Event(1, "forward", "F" + std::to_string(m), f + 10 + m * (f + 4), f));
  int64_t t1 = f + 10 + 4 * (f + 4);
  ev.push_back(Event(0, "receive", "receive 3", 4 * (f + 4), t1 + b + 10 - 4 * (f + 4)));
  for (int m = 3; m >= 0; --m) {
    ev.push_back(Event(1, "backward", "B" + std::to_string(m), t1, b));
    ev.push_back(Event(1, "send", "send " + std::to_string(m), t1 + b, 3));
    ev.push_back(Event(0, "backward", "B" + std::to_string(m), t1 + b + 10, b - 200));
    t1 += b + 5;
  }
  ev.push_back(Event(1, "optimizer", "optimizer", t1, 400));
  ev.push_back(Event(0, "optimizer", "optimizer", t1 + 20 + b, 400));
  return Trace(ev, 2, "gpipe", 4, 1);
}

// Many thin bars side by side, with long labels (two chunks per stage): bars
// from 1 us to 300 us, forward, backward and recompute, sends of 2 us.
json ThinTrace() {
  json ev = json::array();
  const int64_t durations[] = {1, 15, 40, 90, 25, 300, 8, 60, 120, 30, 5, 45};
  const char* kinds[] = {"forward", "backward", "recompute"};
  for (int s = 0; s < 4; ++s) {
    int64_t t = 37 * s;
    for (int i = 0; i < 48; ++i) {
      const std::string kind = kinds[(i + s) % 3];
      const std::string mb = std::to_string(i % 2) + "." + std::to_string(i / 2);
      const int64_t dur = durations[(i + 5 * s) % 12];
      ev.push_back(Event(s, kind, std::string(1, static_cast<char>(std::toupper(kind[0]))) + mb, t, dur));
      t += dur;
      if (kind != "recompute") {
        ev.push_back(Event(s, "send", "send " + mb, t, 2));
        t += 2;
      }
    }
    ev.push_back(Event(s, "optimizer", "optimizer", t, 50));
  }
  return Trace(ev, 4, "interleaved", 24, 2);
}

// What a fixture trace has, and what the script drew of it.
struct Rendered {
  json trace;
  json layout;  // null where the script failed
  fs::path png;
  std::string error;  // why there is no layout
};

class Pictures {
 public:
  static Pictures& Get() {
    static Pictures pictures;
    return pictures;
  }
  const std::string& python() const { return python_; }

  // Draws the named fixture once per process.
  const Rendered& Render(const std::string& name) {
    auto it = rendered_.find(name);
    if (it != rendered_.end()) return it->second;
    Rendered r;
    if (name == "mlp") r.trace = MlpTrace();
    if (name == "thin") r.trace = ThinTrace();
    if (name == "docs-zero-bubble" || name == "docs-interleaved") {
      const fs::path src = fs::path(CONVEYOR_SOURCE_DIR) / "docs/images" / ("timeline-" + name.substr(5) + ".json");
      r.trace = json::parse(Slurp(src), nullptr, /*allow_exceptions=*/false);
      if (r.trace.is_discarded()) {
        r.error = "no trace at " + src.string();
        return rendered_.emplace(name, std::move(r)).first->second;
      }
    }
    const fs::path in = dir_ / (name + ".json"), layout = dir_ / (name + ".layout.json"),
                   err = dir_ / (name + ".stderr");
    r.png = dir_ / (name + ".png");
    std::ofstream(in) << r.trace.dump() << "\n";
    const std::string cmd = Quote(python_) + " " + Quote(PlotScript()) + " " + Quote(in) + " " + Quote(r.png) +
                            " --layout " + Quote(layout) + " >/dev/null 2>" + Quote(err);
    const int rc = std::system(cmd.c_str());
    if (rc != 0) {
      r.error = cmd + " failed (status " + std::to_string(rc) + ")\n" + Slurp(err);
    } else {
      r.layout = json::parse(Slurp(layout), nullptr, /*allow_exceptions=*/false);
      if (r.layout.is_discarded() || !r.layout.is_object()) {
        r.layout = nullptr;
        r.error = "no layout JSON in " + layout.string();
      }
    }
    return rendered_.emplace(name, std::move(r)).first->second;
  }

 private:
  Pictures() : python_(PythonWithMatplotlib()) {
    if (const char* keep = std::getenv("TIMELINE_PICTURE_OUT"); keep && *keep) {
      dir_ = keep;
      fs::create_directories(dir_);
      keep_ = true;
    } else {
      std::string tmpl = (fs::path(::testing::TempDir()) / "timeline_picture_XXXXXX").string();
      dir_ = mkdtemp(tmpl.data()) ? fs::path(tmpl) : fs::temp_directory_path();
    }
  }
  ~Pictures() {
    std::error_code ec;
    if (!keep_) fs::remove_all(dir_, ec);
  }
  std::string python_;
  fs::path dir_;
  bool keep_ = false;
  std::map<std::string, Rendered> rendered_;
};

const std::vector<std::string> kFixtures = {"mlp", "thin", "docs-zero-bubble", "docs-interleaved"};

#define REQUIRE_PYTHON()                                                                                  \
  do {                                                                                                     \
    if (Pictures::Get().python().empty()) GTEST_SKIP() << "no python3 with matplotlib to draw the picture"; \
  } while (0)

// Draws the fixture; false (and a failure in the calling test) where the
// script gave no layout.
bool Draw(const std::string& name, const Rendered** out) {
  *out = &Pictures::Get().Render(name);
  if ((*out)->layout.is_null()) ADD_FAILURE() << (*out)->error;
  return !(*out)->layout.is_null();
}

std::vector<json> EventsOf(const json& trace) {
  std::vector<json> out;
  for (const auto& e : trace["traceEvents"])
    if (e.value("ph", "") == "X") out.push_back(e);
  return out;
}

std::string Box(const json& b) {
  std::ostringstream s;
  s << "[" << b["x0"].get<double>() << ", " << b["y0"].get<double>() << " .. " << b["x1"].get<double>() << ", "
    << b["y1"].get<double>() << "]";
  return s.str();
}

TEST(TimelinePicture, LegendListsExactlyTheKindsPresent) {
  REQUIRE_PYTHON();
  for (const auto& name : kFixtures) {
    SCOPED_TRACE(name);
    const Rendered* r;
    if (!Draw(name, &r)) continue;
    std::set<std::string> present;
    for (const auto& e : EventsOf(r->trace))
      if (kDrawnKinds.count(e["cat"])) present.insert(e["cat"]);
    std::vector<std::string> legend = r->layout["legend"].get<std::vector<std::string>>();
    std::set<std::string> listed(legend.begin(), legend.end());
    EXPECT_EQ(listed.size(), legend.size()) << "a kind listed twice";
    EXPECT_EQ(listed, present) << "the legend must list exactly the kinds the step has";
  }
}

TEST(TimelinePicture, EveryEventIsDrawnWhereItHappened) {
  REQUIRE_PYTHON();
  for (const auto& name : kFixtures) {
    SCOPED_TRACE(name);
    const Rendered* r;
    if (!Draw(name, &r)) continue;
    std::map<std::string, int> want, got;
    for (const auto& e : EventsOf(r->trace))
      if (kDrawnKinds.count(e["cat"])) ++want[e["cat"]];
    const double px0 = r->layout["x_px_at_0_us"], per_us = r->layout["x_px_per_us"];
    ASSERT_GT(per_us, 0);
    for (const auto& b : r->layout["blocks"]) {
      ++got[b["kind"]];
      const double x0 = b["x0"], x1 = b["x1"], true_px = b["dur_us"].get<double>() * per_us;
      EXPECT_NEAR(x0, px0 + b["ts_us"].get<double>() * per_us, 0.5) << b["name"] << " starts off its time";
      EXPECT_GE(x1 - x0, true_px - 0.5) << b["name"] << " drawn shorter than it lasted";
      EXPECT_LE(x1 - x0, std::max(true_px, 3.0) + 0.5) << b["name"] << " drawn much longer than it lasted";
    }
    EXPECT_EQ(got, want);
    // The PNG is the picture the layout describes.
    std::ifstream png(r->png, std::ios::binary);
    unsigned char head[24] = {};
    ASSERT_TRUE(png.read(reinterpret_cast<char*>(head), sizeof head)) << "no PNG at " << r->png;
    auto be32 = [&](int at) { return head[at] << 24 | head[at + 1] << 16 | head[at + 2] << 8 | head[at + 3]; };
    EXPECT_NEAR(be32(16), r->layout["figure"]["width"].get<double>(), 1.0);
    EXPECT_NEAR(be32(20), r->layout["figure"]["height"].get<double>(), 1.0);
  }
}

TEST(TimelinePicture, LabelsNeverOverlap) {
  REQUIRE_PYTHON();
  for (const auto& name : kFixtures) {
    SCOPED_TRACE(name);
    const Rendered* r;
    if (!Draw(name, &r)) continue;
    const json& labels = r->layout["labels"];
    EXPECT_FALSE(labels.empty()) << "no bar labelled at all";
    for (std::size_t i = 0; i < labels.size(); ++i)
      for (std::size_t j = i + 1; j < labels.size(); ++j) {
        const json &a = labels[i], &b = labels[j];
        const double w = std::min(a["x1"].get<double>(), b["x1"].get<double>()) -
                         std::max(a["x0"].get<double>(), b["x0"].get<double>());
        const double h = std::min(a["y1"].get<double>(), b["y1"].get<double>()) -
                         std::max(a["y0"].get<double>(), b["y0"].get<double>());
        EXPECT_FALSE(w > 0 && h > 0) << "label \"" << a["text"].get<std::string>() << "\" " << Box(a)
                                     << " overlaps \"" << b["text"].get<std::string>() << "\" " << Box(b);
      }
  }
}

TEST(TimelinePicture, LabelsLieInsideTheirBars) {
  REQUIRE_PYTHON();
  for (const auto& name : kFixtures) {
    SCOPED_TRACE(name);
    const Rendered* r;
    if (!Draw(name, &r)) continue;
    const json& blocks = r->layout["blocks"];
    std::set<int> labelled;
    for (const auto& l : r->layout["labels"]) {
      const int i = l["block"];
      ASSERT_TRUE(i >= 0 && i < static_cast<int>(blocks.size()));
      labelled.insert(i);
      const json& b = blocks[i];
      const std::string what = "label \"" + l["text"].get<std::string>() + "\" " + Box(l) + " of " +
                               b["name"].get<std::string>() + " " + Box(b);
      EXPECT_GE(l["x0"].get<double>(), b["x0"].get<double>()) << what;
      EXPECT_LE(l["x1"].get<double>(), b["x1"].get<double>()) << what;
      EXPECT_GE(l["y0"].get<double>(), b["y0"].get<double>()) << what;
      EXPECT_LE(l["y1"].get<double>(), b["y1"].get<double>()) << what;
    }
    // Still the look it had: a bar with room for its label has it.
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      const json& b = blocks[i];
      const std::string kind = b["kind"];
      if ((kind == "forward" || kind == "backward" || kind == "weight") &&
          b["x1"].get<double>() - b["x0"].get<double>() >= 40)
        EXPECT_TRUE(labelled.count(static_cast<int>(i))) << b["name"] << " " << Box(b) << " has room but no label";
    }
  }
}

TEST(TimelinePicture, ShortSendsAreVisible) {
  REQUIRE_PYTHON();
  for (const auto& name : kFixtures) {
    SCOPED_TRACE(name);
    const Rendered* r;
    if (!Draw(name, &r)) continue;
    int sends = 0;
    for (const auto& b : r->layout["blocks"]) {
      sends += b["kind"] == "send";
      EXPECT_GE(b["x1"].get<double>() - b["x0"].get<double>(), kMinBlockPx)
          << b["kind"] << " " << b["name"] << " on stage " << b["stage"] << " (" << b["dur_us"] << " us) "
          << Box(b) << " is too thin to see";
    }
    EXPECT_GT(sends, 0);
  }
}

}  // namespace
