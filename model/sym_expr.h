// The symbolic sizes of a program exported with dynamic shapes
// (torch.export's `dynamic_shapes`): an integer expression over the
// program's size symbols, as its serializer writes it (str() of a SymInt,
// sympy's printing: "s0", "8*s0", "s0 + 1", "(s0//2)", "Mod(s0, 2)"; PyTorch
// 2.11 writes sympy's srepr instead: "Symbol('s0', positive=True, integer=True)",
// "Mul(Integer(8), Symbol('s0', ...))").
// Torch-free.
//
// Grammar read: integers, symbols ([A-Za-z_][A-Za-z0-9_]*), unary minus,
// + - * // % and ** (a non-negative power), parentheses, and the calls
// Mod(a, b), PythonMod(a, b), FloorDiv(a, b), CleanDiv(a, b) (exact),
// CeilDiv(a, b), Max(a, b, ...) and Min(a, b, ...), and srepr's
// Symbol('name', assumption=True|False, ...), Integer(n), Add(a, b, ...),
// Mul(a, b, ...) and Pow(a, b).
// Division is floor division, as Python's on ints; anything else (a true
// division, a float, an unknown function) is refused when parsed.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"

namespace conveyor {

class SymExpr {
 public:
  static StatusOr<SymExpr> Parse(const std::string& text);

  // The value with each symbol bound; a symbol without a value is an error
  // naming it.
  StatusOr<int64_t> Eval(const std::map<std::string, int64_t>& symbols) const;
  // The symbols it reads.
  void Symbols(std::set<std::string>* out) const;
  const std::string& text() const { return text_; }
  // Its name where the whole expression is one symbol ("s0"), else empty.
  std::string symbol() const;

  struct Term;  // the parsed tree (sym_expr.cpp)

 private:
  std::string text_;
  std::shared_ptr<const Term> root_;
};

}  // namespace conveyor
