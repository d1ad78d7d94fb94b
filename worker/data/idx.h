// Reader for the IDX format of MNIST and Fashion-MNIST, plain or gzip-compressed.
//
// IDX layout (all integers big-endian):
//   bytes 0-1  zero
//   byte  2    element type: 0x08 unsigned byte (the only one supported here), 0x09 signed
//              byte, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64
//   byte  3    number of dimensions d
//   4 * d      the dimensions, uint32 each
//   then       the elements, row-major
// An image file is [n, rows, cols] (any [n, d1, ..., dk] with k >= 1 is accepted: each
// example is the product of d1..dk bytes); a label file is [n].
#ifndef PS_WORKER_DATA_IDX_H_
#define PS_WORKER_DATA_IDX_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/data/dataset.h"

namespace ps::worker {

// Loads an image file and its label file into a dense Dataset (a DenseDataset): example i
// is the d1*...*dk pixels of image i, each divided by `pixel_scale` (255 maps bytes to
// [0, 1]), with class label labels[i]. Either file may be gzip-compressed (detected from the
// content; the name does not matter).
//
// num_classes: 0 = infer it as (largest label + 1); otherwise every label must be below it
// and the dataset reports num_classes (use the training set's to load its test set).
//
// Errors name the file and the byte offset (in the uncompressed content):
//   NOT_FOUND         a file does not exist (PERMISSION_DENIED etc. as open(2) says);
//   INVALID_ARGUMENT  pixel_scale not finite and > 0, num_classes < 0, bad magic, an element
//                     type other than unsigned byte, wrong number of dimensions, a zero or
//                     overflowing example size, image and label counts that differ, a label
//                     out of range, or bytes after the declared data;
//   RESOURCE_EXHAUSTED  the data a header declares (as floats and int32 labels) takes more
//                     than `max_memory_bytes` (0: this machine's physical memory), before any
//                     of it is read;
//   DATA_LOSS         the file ends before its header says it should (truncation), or a
//                     corrupt gzip stream. Truncation is DATA_LOSS rather than
//                     INVALID_ARGUMENT because the header is intact and the data is gone:
//                     re-downloading fixes it, editing the config does not.
absl::StatusOr<std::unique_ptr<Dataset>> LoadIdxDataset(const std::string& images,
                                                        const std::string& labels,
                                                        float pixel_scale, int num_classes = 0,
                                                        uint64_t max_memory_bytes = 0);

}  // namespace ps::worker

#endif  // PS_WORKER_DATA_IDX_H_
