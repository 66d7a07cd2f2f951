// A thin, allocation-light JSON writer over RapidJSON for the replies of the API.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include <rapidjson/allocators.h>
#include <rapidjson/writer.h>

#include "core/utf8.h"

namespace traincoord {

class JsonWriter {
 public:
  JsonWriter() : writer_(out_, &levels_) {}
  JsonWriter(const JsonWriter&) = delete;
  JsonWriter& operator=(const JsonWriter&) = delete;

  // Keys and strings are written as valid UTF-8 whatever they hold: a byte that does not start
  // a valid character is written as U+FFFD (text stored before names were checked, or echoed
  // from a request in an error). Control characters are escaped (\u001b).
  JsonWriter& key(std::string_view k) {
    if (!utf8::valid(k)) {
      const std::string fixed = utf8::repaired(k);
      writer_.Key(fixed.data(), static_cast<rapidjson::SizeType>(fixed.size()));
      return *this;
    }
    writer_.Key(k.data(), static_cast<rapidjson::SizeType>(k.size()));
    return *this;
  }
  JsonWriter& value(std::string_view s) {
    if (!utf8::valid(s)) {
      const std::string fixed = utf8::repaired(s);
      writer_.String(fixed.data(), static_cast<rapidjson::SizeType>(fixed.size()));
      return *this;
    }
    writer_.String(s.data(), static_cast<rapidjson::SizeType>(s.size()));
    return *this;
  }
  JsonWriter& value(const char* s) { return value(std::string_view(s)); }
  JsonWriter& value(const std::string& s) { return value(std::string_view(s)); }
  JsonWriter& value(bool b) {
    writer_.Bool(b);
    return *this;
  }
  JsonWriter& value(int v) {
    writer_.Int(v);
    return *this;
  }
  JsonWriter& value(unsigned v) {
    writer_.Uint(v);
    return *this;
  }
  JsonWriter& value(long v) {
    writer_.Int64(v);
    return *this;
  }
  JsonWriter& value(long long v) {
    writer_.Int64(v);
    return *this;
  }
  JsonWriter& value(unsigned long v) {
    writer_.Uint64(v);
    return *this;
  }
  JsonWriter& value(unsigned long long v) {
    writer_.Uint64(v);
    return *this;
  }
  // JSON has no NaN or infinity: a non-finite number is written as null.
  JsonWriter& value(double v) {
    if (std::isfinite(v)) {
      writer_.Double(v);
    } else {
      writer_.Null();
    }
    return *this;
  }
  JsonWriter& null() {
    writer_.Null();
    return *this;
  }
  template <typename T>
  JsonWriter& field(std::string_view k, const T& v) {
    return key(k).value(v);
  }
  JsonWriter& begin_object() {
    writer_.StartObject();
    return *this;
  }
  JsonWriter& end_object() {
    writer_.EndObject();
    return *this;
  }
  JsonWriter& begin_array() {
    writer_.StartArray();
    return *this;
  }
  JsonWriter& end_array() {
    writer_.EndArray();
    return *this;
  }

  // Empties the writer for another document (keeping the string's capacity).
  void clear() {
    out_.text.clear();
    writer_.Reset(out_);
  }

  const std::string& str() const { return out_.text; }
  // The text, moved out (the writer is done).
  std::string take() { return std::move(out_.text); }

 private:
  // Written straight into a std::string, and the writer's nesting stack in an inline buffer:
  // no malloc but the string's, and no copy at the end (a reply is written per request).
  struct Out {
    using Ch = char;
    std::string text;
    void Put(char c) { text.push_back(c); }
    void Flush() {}
  };
  using LevelAllocator = rapidjson::MemoryPoolAllocator<rapidjson::CrtAllocator>;
  alignas(8) char level_buffer_[1024];
  LevelAllocator levels_{level_buffer_, sizeof level_buffer_};
  Out out_;
  rapidjson::Writer<Out, rapidjson::UTF8<>, rapidjson::UTF8<>, LevelAllocator> writer_;
};

}  // namespace traincoord
