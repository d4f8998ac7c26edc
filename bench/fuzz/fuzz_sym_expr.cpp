// libFuzzer target: the symbolic sizes of an exported program's graph
// (model/sym_expr.h), text from a .pt2 file a job names: parse any text, and
// evaluate what parses with its symbols bound to values the input picks.
// Input: the first byte picks the symbols' value (small or near the int64
// ends), the rest is the expression.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>

#include "model/sym_expr.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int pick = data[0];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  auto e = conveyor::SymExpr::Parse(text);
  if (!e.ok()) return 0;
  std::set<std::string> names;
  e->Symbols(&names);
  int64_t value = pick % 64 - 8;
  if (pick >= 200) value = std::numeric_limits<int64_t>::max() - (pick - 200);
  if (pick >= 230) value = std::numeric_limits<int64_t>::min() + (pick - 230);
  std::map<std::string, int64_t> symbols;
  for (const std::string& n : names) symbols[n] = value;
  (void)e->Eval(symbols);
  return 0;
}
