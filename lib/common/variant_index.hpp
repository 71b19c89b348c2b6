// The index of an alternative in a std::variant, at compile time: the pure machines
// (rendezvous, the agent's job, the coordinator's round) key their transition tables by it.
#pragma once

#include <cstddef>
#include <type_traits>
#include <variant>

namespace ddp {

template <class T, class V>
struct variant_index;
template <class T, class... Ts>
struct variant_index<T, std::variant<Ts...>> {
  static_assert((std::is_same_v<T, Ts> || ...), "not an alternative of this variant");
  static constexpr std::size_t value = [] {
    std::size_t i = 0;
    ((std::is_same_v<T, Ts> ? false : (++i, true)) && ...);
    return i;
  }();
};

template <class T, class V>
inline constexpr std::size_t variant_index_v = variant_index<T, V>::value;

}  // namespace ddp
