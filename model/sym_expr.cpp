#include "model/sym_expr.h"

#include <algorithm>
#include <cctype>
#include <limits>

namespace conveyor {

struct SymExpr::Term {
  enum Kind { kInt, kSymbol, kNeg, kAdd, kSub, kMul, kFloorDiv, kCeilDiv, kMod, kPow, kMax, kMin } kind = kInt;
  int64_t value = 0;
  std::string symbol;
  std::vector<std::shared_ptr<const Term>> args;
};

namespace {

using TermPtr = std::shared_ptr<const SymExpr::Term>;
using Term = SymExpr::Term;

TermPtr Make(Term::Kind kind, std::vector<TermPtr> args) {
  auto t = std::make_shared<Term>();
  t->kind = kind;
  t->args = std::move(args);
  return t;
}

// Nesting deeper than this is refused (the parser recurses: a program file's
// "((((...))))" must not exhaust the stack).
constexpr int kMaxDepth = 64;

// Recursive descent over the text; `error` holds the first problem.
class Parser {
 public:
  explicit Parser(const std::string& text) : s_(text) {}

  TermPtr Whole() {
    TermPtr t = Sum();
    Space();
    if (t && i_ != s_.size()) return Fail("unexpected '" + s_.substr(i_, 8) + "'");
    return t;
  }
  const std::string& error() const { return error_; }

 private:
  TermPtr Fail(const std::string& why) {
    if (error_.empty()) error_ = why;
    return nullptr;
  }
  void Space() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool Eat(const std::string& token) {
    Space();
    if (s_.compare(i_, token.size(), token) != 0) return false;
    i_ += token.size();
    return true;
  }
  TermPtr Sum() {
    TermPtr t = Product();
    for (;;) {
      if (!t) return t;
      Space();
      if (Eat("+")) {
        t = Pair(Term::kAdd, t, Product());
      } else if (i_ < s_.size() && s_[i_] == '-') {
        ++i_;
        t = Pair(Term::kSub, t, Product());
      } else {
        return t;
      }
    }
  }
  TermPtr Product() {
    TermPtr t = Unary();
    for (;;) {
      if (!t) return t;
      Space();
      if (Eat("//")) {
        t = Pair(Term::kFloorDiv, t, Unary());
      } else if (Eat("*")) {
        t = Pair(Term::kMul, t, Unary());
      } else if (Eat("%")) {
        t = Pair(Term::kMod, t, Unary());
      } else if (i_ < s_.size() && s_[i_] == '/') {
        return Fail("a true division ('/'), which has no integer value");
      } else {
        return t;
      }
    }
  }
  TermPtr Pair(Term::Kind kind, TermPtr a, TermPtr b) {
    if (!a || !b) return nullptr;
    return Make(kind, {std::move(a), std::move(b)});
  }
  TermPtr Unary() {
    struct Nested {  // every recursion passes here
      int& depth;
      explicit Nested(int& d) : depth(++d) {}
      ~Nested() { --depth; }
    } nested(depth_);
    if (depth_ > kMaxDepth) return Fail("nested more than " + std::to_string(kMaxDepth) + " deep");
    if (Eat("-")) {
      TermPtr t = Unary();
      return t ? Make(Term::kNeg, {t}) : nullptr;
    }
    TermPtr base = Atom();
    if (base && Eat("**")) return Pair(Term::kPow, base, Unary());
    return base;
  }
  TermPtr Atom() {
    Space();
    if (i_ >= s_.size()) return Fail("the expression ends early");
    const char c = s_[i_];
    if (c == '(') {
      ++i_;
      TermPtr t = Sum();
      if (t && !Eat(")")) return Fail("a '(' without its ')'");
      return t;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      std::size_t end = i_;
      while (end < s_.size() && std::isdigit(static_cast<unsigned char>(s_[end]))) ++end;
      if (end < s_.size() && (s_[end] == '.' || s_[end] == 'e')) return Fail("a number that is not an integer");
      auto t = std::make_shared<Term>();
      try {
        t->value = std::stoll(s_.substr(i_, end - i_));
      } catch (const std::exception&) {
        return Fail("an integer out of range");
      }
      i_ = end;
      return t;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::size_t end = i_;
      while (end < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[end])) || s_[end] == '_')) ++end;
      const std::string name = s_.substr(i_, end - i_);
      i_ = end;
      Space();
      if (i_ < s_.size() && s_[i_] == '(') return Call(name);
      auto t = std::make_shared<Term>();
      t->kind = Term::kSymbol;
      t->symbol = name;
      return t;
    }
    return Fail(std::string("unexpected '") + c + "'");
  }
  // sympy's srepr form, which PyTorch 2.11's serializer writes: Symbol('s95', positive=True,
  // integer=True), its assumptions skipped.
  TermPtr QuotedSymbol() {
    Space();
    const char quote = i_ < s_.size() ? s_[i_] : '\0';
    if (quote != '\'' && quote != '"') return Fail("a Symbol without its quoted name");
    const std::size_t end = s_.find(quote, i_ + 1);
    if (end == std::string::npos || end == i_ + 1) return Fail("a Symbol without its quoted name");
    auto t = std::make_shared<Term>();
    t->kind = Term::kSymbol;
    t->symbol = s_.substr(i_ + 1, end - i_ - 1);
    i_ = end + 1;
    while (Eat(",")) {  // assumptions: name=True or name=False
      Space();
      std::size_t k = i_;
      while (k < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[k])) || s_[k] == '_')) ++k;
      if (k == i_) return Fail("a Symbol's assumption without its name");
      i_ = k;
      if (!Eat("=")) return Fail("a Symbol's assumption without '='");
      if (!Eat("True") && !Eat("False")) return Fail("a Symbol's assumption that is not True or False");
    }
    if (!Eat(")")) return Fail("a call of Symbol without its ')'");
    return t;
  }
  TermPtr Call(const std::string& name) {
    ++i_;  // '('
    if (name == "Symbol") return QuotedSymbol();
    std::vector<TermPtr> args;
    do {
      TermPtr a = Sum();
      if (!a) return nullptr;
      args.push_back(std::move(a));
    } while (Eat(","));
    if (!Eat(")")) return Fail("a call of " + name + " without its ')'");
    static const std::map<std::string, Term::Kind> binary = {
        {"Mod", Term::kMod}, {"PythonMod", Term::kMod}, {"FloorDiv", Term::kFloorDiv}, {"CeilDiv", Term::kCeilDiv},
        {"CleanDiv", Term::kFloorDiv}};  // CleanDiv: a division PyTorch knows to be exact
    if (auto it = binary.find(name); it != binary.end()) {
      if (args.size() != 2) return Fail(name + " takes two arguments");
      return Make(it->second, std::move(args));
    }
    if (name == "Max" || name == "Min") return Make(name == "Max" ? Term::kMax : Term::kMin, std::move(args));
    // srepr's forms of the arithmetic: Integer(2), Add(a, b, ...), Mul(a, b, ...), Pow(a, b).
    if (name == "Integer") {
      if (args.size() != 1 || args[0]->kind != Term::kInt &&
                                  !(args[0]->kind == Term::kNeg && args[0]->args[0]->kind == Term::kInt))
        return Fail("Integer takes one integer");
      return args[0];
    }
    if (name == "Add" || name == "Mul") {
      TermPtr t = args[0];
      for (std::size_t k = 1; k < args.size(); ++k) t = Make(name == "Add" ? Term::kAdd : Term::kMul, {t, args[k]});
      return t;
    }
    if (name == "Pow") {
      if (args.size() != 2) return Fail("Pow takes two arguments");
      return Make(Term::kPow, std::move(args));
    }
    return Fail("the function " + name + ", which is not read here");
  }

  const std::string& s_;
  std::size_t i_ = 0;
  int depth_ = 0;
  std::string error_;
};

// REQUIRES: b != 0, and not (a == INT64_MIN and b == -1).
int64_t FloorDiv(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

// a ** b for b >= 0 by squaring; false where it leaves int64.
bool Power(int64_t a, int64_t b, int64_t* out) {
  int64_t r = 1;
  while (b > 0) {
    if ((b & 1) && __builtin_mul_overflow(r, a, &r)) return false;
    b >>= 1;
    if (b > 0 && __builtin_mul_overflow(a, a, &a)) return false;
  }
  *out = r;
  return true;
}

StatusOr<int64_t> Value(const Term& t, const std::map<std::string, int64_t>& symbols, const std::string& text) {
  if (t.kind == Term::kInt) return t.value;
  if (t.kind == Term::kSymbol) {
    auto it = symbols.find(t.symbol);
    if (it == symbols.end())
      return absl::FailedPreconditionError("the size '" + text + "' reads " + t.symbol + ", which has no value here");
    return it->second;
  }
  std::vector<int64_t> v;
  for (const TermPtr& a : t.args) {
    CONVEYOR_ASSIGN_OR_RETURN(int64_t x, Value(*a, symbols, text));
    v.push_back(x);
  }
  auto by_zero = [&] { return absl::InvalidArgumentError("the size '" + text + "' divides by zero"); };
  auto overflow = [&] { return absl::InvalidArgumentError("the size '" + text + "' leaves the range of int64"); };
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  int64_t r = 0;
  switch (t.kind) {
    case Term::kNeg:
      if (v[0] == kMin) return overflow();
      return -v[0];
    case Term::kAdd:
      if (__builtin_add_overflow(v[0], v[1], &r)) return overflow();
      return r;
    case Term::kSub:
      if (__builtin_sub_overflow(v[0], v[1], &r)) return overflow();
      return r;
    case Term::kMul:
      if (__builtin_mul_overflow(v[0], v[1], &r)) return overflow();
      return r;
    case Term::kFloorDiv:
    case Term::kCeilDiv:
    case Term::kMod: {
      if (v[1] == 0) return by_zero();
      if (v[0] == kMin && (v[1] == -1 || t.kind == Term::kCeilDiv)) return overflow();  // kMin / -1, or -kMin
      if (t.kind == Term::kFloorDiv) return FloorDiv(v[0], v[1]);
      if (t.kind == Term::kCeilDiv) return -FloorDiv(-v[0], v[1]);
      r = v[0] % v[1];
      return r != 0 && ((r < 0) != (v[1] < 0)) ? r + v[1] : r;  // Python's sign: the divisor's
    }
    case Term::kPow:
      if (v[1] < 0) return absl::InvalidArgumentError("the size '" + text + "' raises to a negative power");
      if (!Power(v[0], v[1], &r)) return overflow();
      return r;
    case Term::kMax: return *std::max_element(v.begin(), v.end());
    case Term::kMin: return *std::min_element(v.begin(), v.end());
    default: return absl::InternalError("the size '" + text + "': unknown term");
  }
}

void Collect(const Term& t, std::set<std::string>* out) {
  if (t.kind == Term::kSymbol) out->insert(t.symbol);
  for (const TermPtr& a : t.args) Collect(*a, out);
}

}  // namespace

StatusOr<SymExpr> SymExpr::Parse(const std::string& text) {
  Parser parser(text);
  TermPtr root = parser.Whole();
  if (!root) return absl::InvalidArgumentError("the symbolic size '" + text + "': " + parser.error());
  SymExpr e;
  e.text_ = text;
  e.root_ = std::move(root);
  return e;
}

StatusOr<int64_t> SymExpr::Eval(const std::map<std::string, int64_t>& symbols) const {
  return Value(*root_, symbols, text_);
}

void SymExpr::Symbols(std::set<std::string>* out) const { Collect(*root_, out); }

std::string SymExpr::symbol() const { return root_->kind == Term::kSymbol ? root_->symbol : std::string(); }

}  // namespace conveyor
