// A thin, allocation-light JSON writer over RapidJSON for the replies of the API.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

namespace traincoord {

class JsonWriter {
 public:
  JsonWriter() : writer_(buffer_) {}

  JsonWriter& key(std::string_view k) {
    writer_.Key(k.data(), static_cast<rapidjson::SizeType>(k.size()));
    return *this;
  }
  JsonWriter& value(std::string_view s) {
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

  std::string str() const { return std::string(buffer_.GetString(), buffer_.GetSize()); }

 private:
  rapidjson::StringBuffer buffer_;
  rapidjson::Writer<rapidjson::StringBuffer> writer_;
};

}  // namespace traincoord
