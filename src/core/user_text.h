// Text that clients give the coordinator and that it stores and shows back: worker names,
// metric names, the monitored metric, the reasons of a cancel or a failure. Checked where it
// enters, so that every reply stays valid UTF-8 and nothing a terminal or a log would act on
// (escape sequences, line breaks in a name, bidirectional overrides) is stored.
#pragma once

#include <cstddef>
#include <string_view>

#include "core/error.h"

namespace traincoord {

enum class TextKind {
  kName,     // 1 to max bytes; no control character at all
  kMessage,  // 0 to max bytes; tab and newline allowed (a traceback), no other control character
};

// Whether `c` may not appear in user text of `kind`: the C0 controls, DEL and the C1 controls
// (U+0080 to U+009F: ESC and CSI start terminal escape sequences), the line and paragraph
// separators (U+2028, U+2029), and the bidirectional formatting characters (U+061C, U+200E,
// U+200F, U+202A to U+202E, U+2066 to U+2069), which reorder how a line is displayed.
// A kMessage may hold tab and newline.
bool forbidden_in_text(char32_t c, TextKind kind);

// Returns nothing when `text` is valid UTF-8 of at most `max_bytes` bytes (and at least one
// for a name) with no forbidden character; else an invalid_argument error naming `field`
// and what is wrong (the byte offset of the first bad character).
Result<void> validate_text(std::string_view field, std::string_view text, size_t max_bytes,
                           TextKind kind = TextKind::kName);

// For a name that identifies something (a worker, a group, a node, a metric): returns nothing
// when `text` (valid UTF-8, as validate_text checked) is in Unicode Normalization Form C and
// holds no default-ignorable code point (U+200B ZERO WIDTH SPACE, U+00AD SOFT HYPHEN, the
// variation selectors, ...), so that two names that look alike are the same bytes; else an
// invalid_argument error naming `field`, the offending character or the NFC form to send.
// ASCII text always passes, at the cost of one scan.
Result<void> check_name_identity(std::string_view field, std::string_view text);

}  // namespace traincoord
