// JSON objects with a key twice: RFC 8259 leaves their meaning open (RapidJSON keeps both and
// finds the first), so a request that has one is refused rather than read one way here and
// another way by whoever wrote or relayed it.
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <rapidjson/rapidjson.h>

namespace traincoord {

// Returns the path of the first key found twice in one object anywhere in `root` (e.g.
// "metrics.accuracy", "completions[1].lease"; keys cut to 64 bytes), or nullopt. Walks the
// document without recursion (any depth), in time about linear in its size. `Value` is a
// RapidJSON GenericValue or GenericDocument.
template <class Document>
std::optional<std::string> find_duplicate_key(const Document& root) {
  using Value = typename Document::ValueType;  // a document's values, or the value itself
  struct Node {
    const Value* value;
    size_t parent;         // index in `nodes`; the root's is itself
    std::string_view key;  // the member name that leads here, or empty for an array item
    size_t index;          // the array index that leads here
  };
  auto name_of = [](const auto& member) {
    return std::string_view(member.name.GetString(), member.name.GetStringLength());
  };
  // Reused from call to call (a request body is checked per request): no malloc once warm.
  thread_local std::vector<Node> nodes;
  thread_local std::vector<size_t> todo;
  thread_local std::vector<std::string_view> names;
  nodes.clear();
  todo.clear();
  struct Trim {  // a huge document's buffers are not kept
    ~Trim() {
      if (nodes.capacity() > 4096) std::vector<Node>().swap(nodes);
      if (todo.capacity() > 4096) std::vector<size_t>().swap(todo);
      if (names.capacity() > 4096) std::vector<std::string_view>().swap(names);
    }
  } trim;
  nodes.push_back({&root, 0, {}, 0});
  todo.push_back(0);
  auto path_to = [&](size_t at, std::string_view last) {
    std::vector<size_t> chain;
    for (size_t i = at; i != 0; i = nodes[i].parent) chain.push_back(i);
    std::string path;
    auto add_key = [&](std::string_view key) {
      if (!path.empty()) path += '.';
      path += key.substr(0, 64);
      if (key.size() > 64) path += "...";
    };
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      const Node& n = nodes[*it];
      if (nodes[n.parent].value->IsArray()) {
        path += "[" + std::to_string(n.index) + "]";
      } else {
        add_key(n.key);
      }
    }
    add_key(last);
    return path;
  };
  while (!todo.empty()) {
    const size_t at = todo.back();
    todo.pop_back();
    const Value& v = *nodes[at].value;
    if (v.IsObject()) {
      names.clear();
      for (auto m = v.MemberBegin(); m != v.MemberEnd(); ++m) names.push_back(name_of(*m));
      std::optional<std::string_view> twice;
      if (names.size() <= 16) {  // the usual body: a handful of keys, no allocation to sort
        for (size_t i = 0; i < names.size() && !twice; ++i) {
          for (size_t j = 0; j < i; ++j) {
            if (names[i] == names[j]) {
              twice = names[i];
              break;
            }
          }
        }
      } else {
        std::sort(names.begin(), names.end());
        auto d = std::adjacent_find(names.begin(), names.end());
        if (d != names.end()) twice = *d;
      }
      if (twice) return path_to(at, *twice);
      for (auto m = v.MemberBegin(); m != v.MemberEnd(); ++m) {
        if (m->value.IsObject() || m->value.IsArray()) {
          nodes.push_back({&m->value, at, name_of(*m), 0});
          todo.push_back(nodes.size() - 1);
        }
      }
    } else if (v.IsArray()) {
      for (size_t i = 0; i < v.Size(); ++i) {
        const Value& item = v[static_cast<rapidjson::SizeType>(i)];
        if (item.IsObject() || item.IsArray()) {
          nodes.push_back({&item, at, {}, i});
          todo.push_back(nodes.size() - 1);
        }
      }
    }
  }
  return std::nullopt;
}

}  // namespace traincoord
