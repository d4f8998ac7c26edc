#include "cli/curves.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <sstream>

#include "cli/plot.h"
#include "common/files.h"

namespace conveyor::cli {

std::string CurvesCsv(const v1::Curves& curves) {
  std::ostringstream out;
  out << std::setprecision(9);
  out << "kind,step,loss,lr,grad_norm,step_seconds,samples_per_second,tokens_per_second,eval_accuracy,"
         "eval_perplexity,unix_ms\n";
  for (const v1::CurvePoint& p : curves.steps()) {
    out << "train," << p.step() << "," << p.loss() << "," << p.lr() << ",";
    if (p.has_grad_norm()) out << p.grad_norm();
    out << "," << p.step_seconds() << "," << p.samples_per_second() << ",";
    if (curves.tokens()) out << p.tokens_per_second();
    out << ",,," << p.unix_ms() << "\n";
  }
  for (const v1::EvalPoint& e : curves.evals()) {
    out << "eval," << e.step() << "," << e.loss() << ",,,,,," << e.accuracy() << ",";
    if (curves.tokens()) out << std::exp(e.loss());
    out << "," << e.unix_ms() << "\n";
  }
  return out.str();
}

Status WriteCurvesCsv(const v1::Curves& curves, const std::string& path) {
  return Annotate(WriteFileAtomically(path, CurvesCsv(curves)), "--metrics-csv " + path);
}

Status PlotCurves(const v1::Curves& curves, const std::string& png_path) {
  if (curves.steps().empty())
    return absl::FailedPreconditionError("job " + curves.job_id() + " has no training steps stored yet");
  std::string csv = png_path + ".csv.XXXXXX";
  const int fd = mkstemp(csv.data());
  if (fd < 0) return absl::PermissionDeniedError("cannot write beside " + png_path);
  close(fd);
  Status st = WriteFileAtomically(csv, CurvesCsv(curves));
  if (st.ok()) st = RunPlotScript("plot_curves.py", "CONVEYOR_CURVES_SCRIPT", {csv, png_path, curves.job_id()});
  std::remove(csv.c_str());
  return st;
}

}  // namespace conveyor::cli
