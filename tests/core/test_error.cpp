// athanor::Error: the formatted message (op, text, hint, file:line), the
// structured accessors, and the module path that ModuleScope contributes.
#include <string>
#include <thread>

#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST(Error, CheckMessageHasOpTextHintAndLocation) {
  int line = 0;
  try {
    const int k = 3;
    line = __LINE__ + 1;
    ATH_CHECK(k == 2, "my_op", "expected k == 2, got ", k, " for ", shape_str({4, 5}), Hint{"pass k = 2"});
    FAIL() << "ATH_CHECK did not throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(contains(msg, "my_op")) << msg;
    EXPECT_TRUE(contains(msg, "expected k == 2, got 3 for [4, 5]")) << msg;
    EXPECT_TRUE(contains(msg, "hint: pass k = 2")) << msg;
    EXPECT_TRUE(contains(msg, "test_error.cpp:" + std::to_string(line))) << msg;
    EXPECT_EQ(e.op(), "my_op");
    EXPECT_EQ(e.message(), "expected k == 2, got 3 for [4, 5]");
    EXPECT_EQ(e.hint(), "pass k = 2");
    EXPECT_EQ(e.module_path(), "");
    EXPECT_FALSE(contains(msg, "(module")) << msg;  // no module scope: no module clause
  }
  // Caught as a std::exception too, and a passing check does nothing.
  EXPECT_THROW(ATH_CHECK(false, "op", "x"), std::runtime_error);
  EXPECT_NO_THROW(ATH_CHECK(true, "op", "x"));
  // Without a Hint there is no hint line.
  const std::string plain = error_message([] { ATH_FAIL("plain_op", "no hint here"); });
  EXPECT_FALSE(contains(plain, "hint:")) << plain;
  EXPECT_TRUE(contains(plain, "plain_op")) << plain;
}

TEST(Error, LibraryErrorsPointIntoTheSourceTree) {
  // An error raised inside the library names a path relative to the repository.
  const std::string msg = error_message([] { (void)zeros({2, 2}).item(); });
  EXPECT_TRUE(contains(msg, "src/core/tensor.cpp:")) << msg;
  EXPECT_FALSE(contains(msg, "/work/")) << msg;
}

TEST(Error, ModuleScopeNesting) {
  EXPECT_EQ(current_module_path(), "");
  {
    ModuleScope a("a");
    EXPECT_EQ(current_module_path(), "a");
    {
      ModuleScope b("b");
      EXPECT_EQ(current_module_path(), "a.b");
      try {
        ATH_CHECK(false, "linear", "shape mismatch");
      } catch (const Error& e) {
        EXPECT_EQ(e.module_path(), "a.b");
        EXPECT_TRUE(contains(e.what(), "(module a.b)")) << e.what();
      }
      {
        ModuleScope anon("");  // an unnamed container adds no component
        EXPECT_EQ(current_module_path(), "a.b");
        ModuleScope c("3");
        EXPECT_EQ(current_module_path(), "a.b.3");
      }
      EXPECT_EQ(current_module_path(), "a.b");
    }
    EXPECT_EQ(current_module_path(), "a");
    const std::string msg = error_message([] { ATH_FAIL("op", "inside a"); });
    EXPECT_TRUE(contains(msg, "(module a)")) << msg;
  }
  EXPECT_EQ(current_module_path(), "");
  // The module stack is per thread.
  ModuleScope main_scope("main");
  std::string other;
  std::thread([&] { other = current_module_path(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_EQ(current_module_path(), "main");
}

TEST(Error, AssertReportsABug) {
  const std::string msg = error_message([] { ATH_ASSERT(1 + 1 == 3); });
  EXPECT_TRUE(contains(msg, "internal invariant violated: 1 + 1 == 3")) << msg;
  EXPECT_TRUE(contains(msg, "hint:")) << msg;
  EXPECT_TRUE(contains(msg, "bug")) << msg;
}

}  // namespace athanor
