// Tests for what io/ does with files that are not what they seem: inputs that are FIFOs or
// devices (refused at once, never waited on), atomic writes over a destination that is not a
// regular file (refused, nothing replaced), the temp files of killed writes, folder locks, and
// the UTF-8 escape of byte strings such as paths.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <thread>

#include "io/atomic_file.h"
#include "io/folder_lock.h"
#include "io/idx.h"
#include "io/image.h"
#include "io/safetensors.h"
#include "io/utf8.h"
#include "test_io_util.h"
#include "test_util.h"

namespace minamp {
namespace {

using test::expect_error;
namespace fs = std::filesystem;

// Runs `read` on another thread and expects it to throw Error containing `fragment` within 10
// seconds. A reader that blocked on the FIFO `fifo` fails the test, and is then released by a
// writer opening the FIFO.
template <class Read>
void expect_refused_at_once(Read read, const std::string& fragment, const std::string& fifo) {
  std::promise<std::string> message;
  std::future<std::string> result = message.get_future();
  std::thread reader([&] {
    try {
      read();
      message.set_value("no error");
    } catch (const Error& e) {
      message.set_value(e.what());
    }
  });
  const bool at_once = result.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  if (!at_once) ::close(::open(fifo.c_str(), O_WRONLY | O_NONBLOCK));
  reader.join();
  EXPECT_TRUE(at_once) << "the reader blocked (" << fragment << ")";
  const std::string text = result.get();
  EXPECT_NE(text.find(fragment), std::string::npos) << text;
}

// Every reader of a file refuses a FIFO (whose open() would wait for a writer forever) and a
// character device, naming the file and what it is.
TEST(InputFiles, FifosAndDevicesAreRefusedWithoutBlocking) {
  test::TempDir dir;
  const std::string fifo = dir.path("images.gz");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  for (const std::string& path : {fifo, std::string("/dev/null")}) {
    const std::string kind = path == fifo ? "(a FIFO)" : "(a character device)";
    const std::string expected = path + ": not a regular file " + kind;
    expect_refused_at_once([path] { io::read_file(path); }, "read_file: " + expected, fifo);
    expect_refused_at_once([path] { io::read_idx(path); }, "read_idx: " + expected, fifo);
    expect_refused_at_once([path] { io::load_image(path, 3); }, expected, fifo);
    expect_refused_at_once([path] { io::load_safetensors(path); }, expected, fifo);
  }
  expect_refused_at_once([&] { io::read_idx(dir.root()); }, "not a regular file (a directory)",
                         fifo);
}

// An atomic write replaces only a regular file: a device (as root, rename() would put a file in
// place of /dev/null), a FIFO, a symbolic link or a directory stays as it is, and no temp file
// is left next to it.
TEST(AtomicFile, RefusesToReplaceWhatIsNotARegularFile) {
  test::TempDir dir;
  const std::string fifo = dir.path("fifo"), link = dir.path("link"), target = dir.path("target");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  io::write_file_atomically(target, "kept");
  fs::create_symlink(target, link);
  fs::create_directory(dir.path("folder"));
  std::vector<std::pair<std::string, std::string>> cases = {
      {fifo, "exists and is a FIFO, not a regular file"},
      {link, "exists and is a symbolic link, not a regular file: replacing it would replace the "
             "link, not its target"},
      {dir.path("folder"), "exists and is a directory"}};
  // A character device of its own (a copy of /dev/null), where this process may make one.
  const std::string device = dir.path("null");
  if (::mknod(device.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0)
    cases.push_back({device, "exists and is a character device"});
  for (const auto& [path, message] : cases) {
    expect_error([&] { io::write_file_atomically(path, "x"); },
                 "write_file_atomically: " + path + ": " + message);
    expect_error([&] { io::require_writable(path, "--json"); }, "--json: " + path + ": " + message);
    EXPECT_FALSE(fs::is_regular_file(fs::symlink_status(path))) << path << " was replaced";
  }
  EXPECT_EQ(io::read_file(link), "kept");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.root()), fs::directory_iterator()),
            std::ptrdiff_t(cases.size() + 1))
      << "a temp file was left";
}

// A file name of up to 255 bytes is written (its temp file's name is cut to fit), and its temp
// files are found again; a folder that exists but takes no new file is not said to be missing.
TEST(AtomicFile, WritesLongNamesAndNamesWhyATempFileCannotBeMade) {
  test::TempDir dir;
  const std::string name(250, 'n');
  io::write_file_atomically(dir.path(name), "long");
  EXPECT_EQ(io::read_file(dir.path(name)), "long");
  const std::string stale = name.substr(0, 244) + ".tmp.a1B2c3";
  io::write_file_atomically(dir.path(stale), "partial");
  io::remove_stale_temp_files(dir.root(), name);
  EXPECT_FALSE(fs::exists(dir.path(stale)));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.root()), fs::directory_iterator()), 1);
  expect_error([&] { io::require_writable(dir.path("missing/x.json"), "--json"); },
               "--json: " + dir.path("missing/x.json") + ": its folder does not exist");
  if (fs::is_directory("/proc"))
    expect_error([&] { io::require_writable("/proc/x.json", "--json"); },
                 "--json: /proc/x.json: cannot create a temp file next to it (");
}

// The temp files a killed write_file_atomically left ("<name>.tmp." and six characters) are
// removed; anything else, however alike, stays.
TEST(AtomicFile, RemovesTheTempFilesOfKilledWritesOnly) {
  test::TempDir dir;
  const std::vector<std::string> stale = {"metrics.csv.tmp.a1B2c3", "metrics.csv.tmp.XXXXXX"};
  const std::vector<std::string> kept = {"metrics.csv", "metrics.csv.tmp.a1B2c",
                                         "metrics.csv.tmp.a1B2c3d", "summary.json.tmp.a1B2c3",
                                         "xmetrics.csv.tmp.a1B2c3"};
  for (const std::string& name : stale) io::write_file_atomically(dir.path(name), "partial");
  for (const std::string& name : kept) io::write_file_atomically(dir.path(name), "mine");
  fs::create_directory(dir.path("metrics.csv.tmp.folder")); // not a regular file: kept
  io::remove_stale_temp_files(dir.root(), "metrics.csv");
  for (const std::string& name : stale) EXPECT_FALSE(fs::exists(dir.path(name))) << name;
  for (const std::string& name : kept) EXPECT_EQ(io::read_file(dir.path(name)), "mine") << name;
  EXPECT_TRUE(fs::is_directory(dir.path("metrics.csv.tmp.folder")));
}

// A locked folder refuses a second lock, naming the folder and the holder's PID; the lock file is
// removed on release, and one left by a process that is gone (no lock held on it) is taken over.
TEST(FolderLock, HoldsAFolderForOneHolderAtATime) {
  test::TempDir dir;
  const std::string lock_file = dir.path(io::FolderLock::kFileName);
  {
    const io::FolderLock lock(dir.root(), "--out");
    EXPECT_EQ(io::read_file(lock_file), std::to_string(::getpid()) + "\n");
    expect_error([&] { io::FolderLock second(dir.root(), "--out"); },
                 "--out: " + dir.root() + " is in use by another minamp run (PID " +
                     std::to_string(::getpid()) + ")");
  }
  EXPECT_FALSE(fs::exists(lock_file)) << "released, the lock file is removed";
  io::write_file_atomically(lock_file, "999999\n"); // stale: nobody holds it
  { const io::FolderLock lock(dir.root(), "--out"); }
  EXPECT_FALSE(fs::exists(lock_file));
  expect_error([&] { io::FolderLock lock(dir.path("missing"), "--out"); },
               "--out: " + dir.path("missing") + ": cannot create its lock file");
}

TEST(Utf8, ValidatesAndEscapesLosslessly) {
  for (const std::string& valid : {std::string(""), std::string("plain/path.png"),
                                   std::string("caf\xc3\xa9/\xe2\x82\xac/\xf0\x9f\x98\x80")})
    EXPECT_TRUE(io::is_valid_utf8(valid)) << valid;
  for (const std::string& invalid :
       {std::string("\xff"), std::string("a\xc3"), std::string("\xc0\xaf"), // truncated, overlong
        std::string("\xed\xa0\x80"), std::string("\xf4\x90\x80\x80"),       // surrogate, > U+10FFFF
        std::string("\x80")})
    EXPECT_FALSE(io::is_valid_utf8(invalid)) << io::escape_to_utf8(invalid);

  EXPECT_EQ(io::escape_to_utf8("data/caf\xc3\xa9"), "data/caf\xc3\xa9"); // unchanged
  EXPECT_EQ(io::escape_to_utf8("imgs\xff/a\\b"), "imgs\\xff/a\\\\b");
  EXPECT_EQ(io::escape_to_utf8("\xc3"), "\\xc3");
  // Lossless: two different byte strings never escape to the same text.
  EXPECT_NE(io::escape_to_utf8("\xff"), io::escape_to_utf8("\\xff"));
  for (const std::string& bytes : {std::string("\xff"), std::string("\x80\x80\xc3\xa9\\")})
    EXPECT_TRUE(io::is_valid_utf8(io::escape_to_utf8(bytes)));
}

// A safetensors header is JSON: names and metadata that are not UTF-8 are refused by name,
// before anything is written.
TEST(Utf8, SafetensorsRefusesNamesAndMetadataThatAreNotUtf8) {
  test::TempDir dir;
  const std::string path = dir.path("x.safetensors");
  expect_error(
      [&] {
        io::save_safetensors(path, {{"w\xff", Tensor::zeros({1})}});
      },
      path, "entry name 'w\\xff' is not valid UTF-8");
  expect_error(
      [&] {
        io::save_safetensors(path, {}, {{"data", "imgs\xff"}});
      },
      path, "metadata 'data' = 'imgs\\xff' is not valid UTF-8");
  EXPECT_FALSE(fs::exists(path));
}

} // namespace
} // namespace minamp
