// A job's training curves (the coordinator's GetCurves) as a CSV file for
// other tools and as one PNG drawn by cli/plot_curves.py with matplotlib:
// training and evaluation loss, throughput, accuracy or perplexity, and the
// learning rate against steps.
#pragma once

#include <string>

#include "common/status.h"
#include "conveyor.pb.h"

namespace conveyor::cli {

// The CSV: a header, then one row per training step ("train") and one per
// evaluation ("eval"), by step. Columns: kind, step, loss, lr, grad_norm,
// step_seconds, samples_per_second, tokens_per_second, eval_accuracy,
// eval_perplexity (token jobs only), unix_ms; a cell that does not apply is
// empty.
std::string CurvesCsv(const v1::Curves& curves);
Status WriteCurvesCsv(const v1::Curves& curves, const std::string& path);

// Draws `curves` into `png_path`. FAILED_PRECONDITION when there is nothing
// to draw (no step stored yet).
Status PlotCurves(const v1::Curves& curves, const std::string& png_path);

}  // namespace conveyor::cli
