#include "worker/data/file_reader.h"

#include <memory>
#include <string>

#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/test_files.h"

namespace ps::worker {
namespace {

using ::ps::common::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string ReadAllLines(FileReader& reader, int* lines) {
  std::string all;
  std::string line;
  *lines = 0;
  while (true) {
    absl::StatusOr<bool> more = reader.ReadLine(&line);
    EXPECT_TRUE(more.ok()) << more.status();
    if (!more.ok() || !*more) break;
    ++*lines;
    all += line + "|";
  }
  return all;
}

TEST(FileReader, ReadsLinesOfPlainFile) {
  const std::string path =
      test_files::WriteFile(test_files::TempPath("plain.txt"), "a b\r\n\nlast without newline");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FileReader> reader, FileReader::Open(path));
  EXPECT_FALSE(reader->compressed());
  int lines = 0;
  EXPECT_EQ(ReadAllLines(*reader, &lines), "a b\r||last without newline|");
  EXPECT_EQ(lines, 3);
  EXPECT_EQ(reader->offset(), 26u);
}

TEST(FileReader, GunzipsTransparently) {
  const std::string path =
      test_files::WriteGzipFile(test_files::TempPath("lines.gz"), "one\ntwo\n");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FileReader> reader, FileReader::Open(path));
  EXPECT_TRUE(reader->compressed());
  int lines = 0;
  EXPECT_EQ(ReadAllLines(*reader, &lines), "one|two|");
  EXPECT_EQ(lines, 2);
  EXPECT_EQ(reader->offset(), 8u);
}

TEST(FileReader, ReadServesReadAheadFirst) {
  const std::string path =
      test_files::WriteGzipFile(test_files::TempPath("mixed.gz"), "head\nBODY");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FileReader> reader, FileReader::Open(path));
  std::string line;
  ASSERT_OK_AND_ASSIGN(bool more, reader->ReadLine(&line));
  EXPECT_TRUE(more);
  EXPECT_EQ(line, "head");
  char buf[10];
  ASSERT_OK_AND_ASSIGN(size_t got, reader->Read(buf, sizeof(buf)));
  EXPECT_EQ(std::string(buf, got), "BODY");
  EXPECT_EQ(reader->offset(), 9u);
  ASSERT_OK_AND_ASSIGN(got, reader->Read(buf, sizeof(buf)));
  EXPECT_EQ(got, 0u);
}

TEST(FileReader, ReadsLinesLongerThanItsBuffer) {
  const std::string long_line(700 << 10, 'x');
  const std::string path =
      test_files::WriteGzipFile(test_files::TempPath("long.gz"), long_line + "\nshort\n");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FileReader> reader, FileReader::Open(path));
  std::string line;
  ASSERT_OK_AND_ASSIGN(bool more, reader->ReadLine(&line));
  EXPECT_TRUE(more);
  EXPECT_EQ(line, long_line);
  ASSERT_OK_AND_ASSIGN(more, reader->ReadLine(&line));
  EXPECT_EQ(line, "short");
}

// A line is capped when asked: a gzip file of a few KB can hold a line of any length.
TEST(FileReader, ALineLongerThanTheCapIsResourceExhausted) {
  const std::string long_line(700 << 10, 'x');
  const std::string path = test_files::WriteGzipFile(test_files::TempPath("capped.gz"),
                                                     "first\n" + long_line + "\nshort\n");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FileReader> reader, FileReader::Open(path));
  std::string line;
  ASSERT_OK_AND_ASSIGN(bool more, reader->ReadLine(&line, 5));  // exactly the cap
  EXPECT_TRUE(more);
  EXPECT_EQ(line, "first");
  EXPECT_THAT(reader->ReadLine(&line, 600 << 10),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("capped.gz: byte 6: a line longer than 614400 bytes"))));
  EXPECT_TRUE(line.empty());
}

TEST(FileReader, MissingFileIsNotFound) {
  EXPECT_THAT(FileReader::Open(test_files::TempPath("no_such_file")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no_such_file")));
}

TEST(FileReader, DirectoryIsInvalidArgument) {
  EXPECT_THAT(FileReader::Open(test_files::TempPath("")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("directory")));
}

TEST(FileReader, TruncatedGzipIsDataLoss) {
  std::string data(100000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 7919) % 251);
  const std::string gz = test_files::Gzip(data);
  const std::string path =
      test_files::WriteFile(test_files::TempPath("truncated.gz"), gz.substr(0, gz.size() / 2));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FileReader> reader, FileReader::Open(path));
  std::string out(data.size(), '\0');
  EXPECT_THAT(reader->Read(out.data(), out.size()),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated.gz: truncated gzip")));
}

TEST(FileReader, CorruptGzipIsDataLoss) {
  std::string gz = test_files::Gzip(std::string(10000, 'a') + std::string(10000, 'b'));
  for (size_t i = 12; i < gz.size() - 8; ++i) gz[i] = static_cast<char>(gz[i] ^ 0x5a);
  const std::string path = test_files::WriteFile(test_files::TempPath("corrupt.gz"), gz);
  absl::StatusOr<std::unique_ptr<FileReader>> reader = FileReader::Open(path);
  // zlib may notice at the first byte (Open) or later (Read); either way it is DATA_LOSS.
  if (reader.ok()) {
    std::string out(20000, '\0');
    EXPECT_THAT((*reader)->Read(out.data(), out.size()),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("corrupt.gz")));
  } else {
    EXPECT_THAT(reader, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("corrupt.gz")));
  }
}

// Members one after the other (`cat a.gz b.gz`) are one stream, as gzip(1) reads them.
TEST(FileReader, ReadsConcatenatedGzipMembersAsOneStream) {
  const std::string path = test_files::WriteFile(
      test_files::TempPath("members.gz"),
      test_files::Gzip("one\ntwo\n") + test_files::Gzip("three\n") + test_files::Gzip(""));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FileReader> reader, FileReader::Open(path));
  int lines = 0;
  EXPECT_EQ(ReadAllLines(*reader, &lines), "one|two|three|");
  EXPECT_EQ(lines, 3);
}

// zlib's gzread drops whatever follows a member that is not another one: a file whose later
// part is damaged would be read as a shorter, valid-looking one.
TEST(FileReader, BytesAfterTheGzipStreamAreDataLoss) {
  for (const std::string& tail : {std::string("x"), std::string("junk after it"),
                                  std::string(4096, '\0'), std::string("\x1f")}) {
    const std::string path = test_files::WriteFile(test_files::TempPath("tail.gz"),
                                                   test_files::Gzip("one\ntwo\n") + tail);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<FileReader> reader, FileReader::Open(path));
    std::string all(64, '\0');
    EXPECT_THAT(
        reader->Read(all.data(), all.size()),
        StatusIs(absl::StatusCode::kDataLoss,
                 AllOf(HasSubstr("tail.gz: "), HasSubstr("after the end of the gzip stream"))))
        << tail.size() << " bytes of tail";
  }
}

// A second member cut short is as truncated as a first one.
TEST(FileReader, ATruncatedLaterMemberIsDataLoss) {
  std::string data(100000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 7919) % 251);
  const std::string second = test_files::Gzip(data);
  const std::string path =
      test_files::WriteFile(test_files::TempPath("second.gz"),
                            test_files::Gzip("head\n") + second.substr(0, second.size() / 2));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FileReader> reader, FileReader::Open(path));
  std::string out(5 + data.size(), '\0');
  EXPECT_THAT(reader->Read(out.data(), out.size()),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("second.gz: truncated gzip")));
}

// A plain file is read as it is, also one of one byte or none.
TEST(FileReader, ReadsShortPlainFiles) {
  for (const std::string& contents : {std::string(""), std::string("a"), std::string("\x1f")}) {
    const std::string path = test_files::WriteFile(test_files::TempPath("short.txt"), contents);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<FileReader> reader, FileReader::Open(path));
    EXPECT_FALSE(reader->compressed());
    std::string out(8, '\0');
    ASSERT_OK_AND_ASSIGN(size_t got, reader->Read(out.data(), out.size()));
    EXPECT_EQ(out.substr(0, got), contents);
  }
}

}  // namespace
}  // namespace ps::worker
