// data/jsonl.h: fine-tuning data as JSON Lines (one JSON object a line), the records `dptrain tokenize` and
// data.dataset = "jsonl" read (data/tokenize.h's tokenize_jsonl writes them as token shards with loss masks).
//
// A record is one of
//   {"text": "..."}                           language modelling: every token of the text is trained;
//   {"prompt": "...", "completion": "..."}    the completion's tokens are trained, the prompt's are context only.
// Other keys are ignored (an "id", a "source"); a record with both "text" and "prompt", with "prompt" and no
// "completion" (or the reverse), with a value that is not a string, or that is not a JSON object is malformed, and
// so is a chat record ("messages": render it into prompt and completion first). A blank line is no record.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace dpt::data {

struct JsonlRecord {
  std::optional<std::string> prompt;  // prompt/completion records: context only
  std::string text;                   // the text, or the completion: trained
};

// The record of one line, or nullopt for a blank one (only white space). ConfigError saying what is wrong with a
// malformed line (without its place: the caller adds file and line).
std::optional<JsonlRecord> parse_jsonl_record(std::string_view line);

// The prompt of one line of a prompts file (`dptrain predict --input PROMPTS.jsonl`): the "prompt" of a record as
// parse_jsonl_record reads it (its "completion", the answer a fine-tune trained on, ignored), or of {"prompt": ...}
// alone; nullopt for a blank line. ConfigError, as parse_jsonl_record's, for a malformed line, a {"text": ...} record
// (no prompt in it) and an empty prompt.
std::optional<std::string> parse_jsonl_prompt(std::string_view line);

}  // namespace dpt::data
