// Run configs sent as JSON (POST /v1/runs): converted to the TOML tree, then read by the same
// code as a file, so both forms accept and refuse exactly the same things.
#include <filesystem>
#include <string>

#include <rapidjson/document.h>
#include <rapidjson/error/en.h>
#include <rapidjson/memorystream.h>
#include <toml++/toml.h>

#include "config/config_file.h"
#include "json/duplicate_keys.h"

namespace traincoord {

Result<RunConfig> parse_run_config_table(const toml::table& root, std::string_view source,
                                         const std::filesystem::path* base);

namespace {

constexpr int kMaxDepth = 4;

Result<void> convert(const rapidjson::Value& in, const std::string& path, int depth,
                     toml::table* out);

Result<void> insert(const rapidjson::Value& v, const std::string& key, const std::string& path,
                    int depth, toml::table* out) {
  if (v.IsBool()) {
    out->insert(key, v.GetBool());
  } else if (v.IsInt64()) {
    out->insert(key, v.GetInt64());
  } else if (v.IsUint64()) {
    return invalid_argument(path, path + ": integer out of range");
  } else if (v.IsNumber()) {
    out->insert(key, v.GetDouble());
  } else if (v.IsString()) {
    out->insert(key, std::string(v.GetString(), v.GetStringLength()));
  } else if (v.IsObject()) {
    if (depth >= kMaxDepth) return invalid_argument(path, path + ": nested too deeply");
    toml::table sub;
    if (auto r = convert(v, path, depth + 1, &sub); !r) return r;
    out->insert(key, std::move(sub));
  } else if (v.IsArray() && path.rfind("lengths.", 0) == 0) {  // [lengths]: arrays of numbers
    toml::array array;
    array.reserve(v.Size());
    for (const rapidjson::Value& item : v.GetArray()) {
      if (!item.IsNumber()) return invalid_argument(path, path + ": lengths must be numbers");
      array.push_back(item.GetDouble());
    }
    out->insert(key, std::move(array));
  } else {
    return invalid_argument(path, path + ": null and arrays are not config values");
  }
  return {};
}

Result<void> convert(const rapidjson::Value& in, const std::string& prefix, int depth,
                     toml::table* out) {
  for (auto it = in.MemberBegin(); it != in.MemberEnd(); ++it) {
    const std::string key(it->name.GetString(), it->name.GetStringLength());
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (auto r = insert(it->value, key, path, depth, out); !r) return r;
  }
  return {};
}

}  // namespace

Result<RunConfig> parse_run_config_json(std::string_view json, std::string_view source) {
  rapidjson::Document doc;
  if (const size_t nul = json.find('\0'); nul != std::string_view::npos) {
    return invalid_argument("", std::string(source) + ": a NUL byte at offset " +
                                    std::to_string(nul) + "; a JSON text holds none");
  }
  // A plain MemoryStream, not Parse(data, size): that one skips a byte order mark and any lone
  // 0xEF, 0xBB or 0xBF byte before the text (see parse_body in server/api.cc).
  rapidjson::MemoryStream stream(json.data(), json.size());
  doc.ParseStream<rapidjson::kParseIterativeFlag, rapidjson::UTF8<>>(stream);  // no recursion
  if (doc.HasParseError()) {
    return invalid_argument("", std::string(source) + ": invalid JSON at offset " +
                                    std::to_string(doc.GetErrorOffset()) + ": " +
                                    rapidjson::GetParseError_En(doc.GetParseError()));
  }
  if (!doc.IsObject()) return invalid_argument("", std::string(source) + ": expected an object");
  // (read into a TOML table, the first of two equal keys would win)
  if (auto key = find_duplicate_key(doc)) {
    return invalid_argument(
        *key, std::string(source) + ": the key " + *key + " is there twice; give each key once");
  }
  toml::table root;
  if (auto r = convert(doc, "", 0, &root); !r) return tl::unexpected(r.error());
  return parse_run_config_table(root, source, nullptr);  // no file is read
}

}  // namespace traincoord
