// Status propagation macros for the public host API.
// Debian's abseil (20220623) ships no RETURN_IF_ERROR / ASSIGN_OR_RETURN, so eagle3 defines its own.
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define EAGLE3_INTERNAL_CONCAT_IMPL(a, b) a##b
#define EAGLE3_INTERNAL_CONCAT(a, b) EAGLE3_INTERNAL_CONCAT_IMPL(a, b)

// Evaluates `expr` (an absl::Status) once and returns it from the enclosing function when not OK.
#define EAGLE3_RETURN_IF_ERROR(expr)                          \
  do {                                                        \
    ::absl::Status eagle3_status_ = (expr);                   \
    if (!eagle3_status_.ok()) return eagle3_status_;          \
  } while (false)

// `EAGLE3_ASSIGN_OR_RETURN(auto x, Foo());` evaluates an absl::StatusOr<T> once; on error returns its
// status, otherwise move-assigns the value to the left-hand side (a declaration or an lvalue).
// It expands to several statements: under an `if`, put it in braces.
#define EAGLE3_ASSIGN_OR_RETURN(lhs, rexpr) \
  EAGLE3_INTERNAL_ASSIGN_OR_RETURN(EAGLE3_INTERNAL_CONCAT(eagle3_statusor_, __LINE__), lhs, rexpr)

#define EAGLE3_INTERNAL_ASSIGN_OR_RETURN(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                     \
  if (!statusor.ok()) return std::move(statusor).status();     \
  lhs = std::move(statusor).value()
