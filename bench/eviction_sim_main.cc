// eviction_sim: hit ratios of eviction policies for a sparse table's memory budget, on the key
// stream the spill benchmark uses (pulls of unique keys drawn from a Zipf distribution).
//
//   bazel build //bench:eviction_sim && bazel-bin/bench/eviction_sim --zipf=1.1,0.9
//
// Every policy is simulated as the server runs it: the budget split evenly over 256 stripes
// (a key's stripe is the top byte of common::Mix64(key)), each stripe evicting on its own.
// Policies:
//   lru          least recently used (a list per stripe);
//   clock        second chance (one reference bit per row, a hand per stripe);
//   sampled_lfu  what SparseTablePart does: the least used of 16 random rows of the stripe,
//                use counters halved every 20 x (stripe budget) uses;
//   lfu          exact least frequently used with the same aging (ties: least recently
//                used), for reference.
// The hit ratio counts the row uses after a warm-up third of the stream that found the row in
// memory.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <list>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/hash.h"

ABSL_FLAG(uint64_t, key_space, 1000000, "Rows of the table (keys 0..key_space-1).");
ABSL_FLAG(std::string, zipf, "1.1,0.9", "Zipf exponents of the key stream, comma-separated.");
ABSL_FLAG(std::string, budgets, "25,5", "Rows in memory, in percent of key_space.");
ABSL_FLAG(uint64_t, keys_per_pull, 10000, "Unique keys per pull.");
ABSL_FLAG(uint64_t, pulls, 300, "Pulls in the stream.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the key stream.");

namespace ps::bench {
namespace {

constexpr int kStripes = 256;
constexpr int kSamples = 16;
constexpr uint64_t kAgingPeriod = 20;

int StripeOf(uint64_t key) { return static_cast<int>(common::Mix64(key) >> 56); }

// One stripe's cache of `budget` rows. Access() returns true on a hit and brings the row in
// otherwise (evicting one when full).
class Lru {
 public:
  explicit Lru(uint64_t budget) : budget_(budget) {}
  bool Access(uint64_t key) {
    if (auto it = where_.find(key); it != where_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      return true;
    }
    if (budget_ == 0) return false;
    if (where_.size() >= budget_) {
      where_.erase(order_.back());
      order_.pop_back();
    }
    order_.push_front(key);
    where_[key] = order_.begin();
    return false;
  }

 private:
  uint64_t budget_;
  std::list<uint64_t> order_;
  absl::flat_hash_map<uint64_t, std::list<uint64_t>::iterator> where_;
};

class Clock {
 public:
  explicit Clock(uint64_t budget) : budget_(budget) {}
  bool Access(uint64_t key) {
    if (auto it = slot_.find(key); it != slot_.end()) {
      referenced_[it->second] = true;
      return true;
    }
    if (budget_ == 0) return false;
    size_t s;
    if (keys_.size() < budget_) {
      s = keys_.size();
      keys_.push_back(key);
      referenced_.push_back(false);
    } else {
      while (referenced_[hand_]) {
        referenced_[hand_] = false;
        hand_ = (hand_ + 1) % budget_;
      }
      s = hand_;
      slot_.erase(keys_[s]);
      keys_[s] = key;
      referenced_[s] = false;
      hand_ = (hand_ + 1) % budget_;
    }
    slot_[key] = s;
    return false;
  }

 private:
  uint64_t budget_;
  std::vector<uint64_t> keys_;
  std::vector<bool> referenced_;
  size_t hand_ = 0;
  absl::flat_hash_map<uint64_t, size_t> slot_;
};

// LFU with use counters halved every kAgingPeriod x budget uses; the victim is the least used
// of kSamples random rows (sampled) or of all rows (exact).
class Lfu {
 public:
  Lfu(uint64_t budget, bool sampled, uint64_t seed)
      : budget_(budget), sampled_(sampled), rng_(seed) {}
  bool Access(uint64_t key) {
    if (++uses_since_aging_ >= kAgingPeriod * std::max<uint64_t>(budget_, 8)) {
      uses_since_aging_ = 0;
      for (uint32_t& u : uses_) u >>= 1;
    }
    ++now_;
    if (auto it = slot_.find(key); it != slot_.end()) {
      ++uses_[it->second];
      last_[it->second] = now_;
      return true;
    }
    if (budget_ == 0) return false;
    size_t s;
    if (keys_.size() < budget_) {
      s = keys_.size();
      keys_.push_back(key);
      uses_.push_back(0);
      last_.push_back(0);
    } else {
      s = Victim();
      slot_.erase(keys_[s]);
      keys_[s] = key;
    }
    uses_[s] = 1;
    last_[s] = now_;
    slot_[key] = s;
    return false;
  }

 private:
  size_t Victim() {
    size_t best = 0;
    if (!sampled_ || keys_.size() <= kSamples) {
      for (size_t j = 1; j < keys_.size(); ++j) {
        if (uses_[j] < uses_[best] || (uses_[j] == uses_[best] && last_[j] < last_[best])) {
          best = j;
        }
      }
      return best;
    }
    best = rng_() % keys_.size();
    for (int i = 1; i < kSamples; ++i) {
      const size_t j = rng_() % keys_.size();
      if (uses_[j] < uses_[best]) best = j;
    }
    return best;
  }

  uint64_t budget_;
  bool sampled_;
  std::mt19937_64 rng_;
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> uses_;
  std::vector<uint64_t> last_;  // time of the last use
  uint64_t now_ = 0;
  uint64_t uses_since_aging_ = 0;
  absl::flat_hash_map<uint64_t, size_t> slot_;
};

// A policy over all stripes.
template <typename Stripe>
class Sharded {
 public:
  template <typename... Args>
  Sharded(uint64_t budget, Args... args) {
    for (int i = 0; i < kStripes; ++i) {
      stripes_.emplace_back(budget / kStripes + (static_cast<uint64_t>(i) < budget % kStripes),
                            args...);
    }
  }
  bool Access(uint64_t key) { return stripes_[StripeOf(key)].Access(key); }

 private:
  std::vector<Stripe> stripes_;
};

std::vector<std::vector<uint64_t>> Stream(uint64_t space, double s, uint64_t per_pull,
                                          uint64_t pulls, uint64_t seed) {
  std::vector<double> cdf(space);
  double c = 0;
  for (uint64_t k = 0; k < space; ++k) cdf[k] = c += std::pow(static_cast<double>(k) + 1, -s);
  for (double& v : cdf) v /= c;
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint64_t>> stream(pulls);
  for (auto& pull : stream) {
    absl::flat_hash_set<uint64_t> seen;
    while (pull.size() < per_pull) {
      const double u = std::uniform_real_distribution<double>(0, 1)(rng);
      const uint64_t k =
          std::min<uint64_t>(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin(), space - 1);
      if (seen.insert(k).second) pull.push_back(k);
    }
  }
  return stream;
}

template <typename Policy>
double HitRatio(Policy policy, const std::vector<std::vector<uint64_t>>& stream) {
  uint64_t hits = 0, uses = 0;
  for (size_t p = 0; p < stream.size(); ++p) {
    for (uint64_t key : stream[p]) {
      const bool hit = policy.Access(key);
      if (p >= stream.size() / 3) {
        hits += hit;
        ++uses;
      }
    }
  }
  return uses == 0 ? 0 : static_cast<double>(hits) / uses;
}

int Main() {
  const uint64_t space = absl::GetFlag(FLAGS_key_space);
  std::printf("%-8s %-8s %8s %8s %12s %8s\n", "zipf", "budget", "lru", "clock", "sampled_lfu",
              "lfu");
  for (absl::string_view z : absl::StrSplit(absl::GetFlag(FLAGS_zipf), ',')) {
    double s = 0;
    if (!absl::SimpleAtod(z, &s) || s < 0) {
      std::fprintf(stderr, "--zipf: bad exponent '%s'\n", std::string(z).c_str());
      return 2;
    }
    const auto stream = Stream(space, s, absl::GetFlag(FLAGS_keys_per_pull),
                               absl::GetFlag(FLAGS_pulls), absl::GetFlag(FLAGS_seed));
    for (absl::string_view b : absl::StrSplit(absl::GetFlag(FLAGS_budgets), ',')) {
      double percent = 0;
      if (!absl::SimpleAtod(b, &percent) || percent <= 0 || percent > 100) {
        std::fprintf(stderr, "--budgets: bad percentage '%s'\n", std::string(b).c_str());
        return 2;
      }
      const uint64_t budget = static_cast<uint64_t>(space * percent / 100);
      std::printf("%-8.2f %-8s %8.3f %8.3f %12.3f %8.3f\n", s, (std::string(b) + "%").c_str(),
                  HitRatio(Sharded<Lru>(budget), stream), HitRatio(Sharded<Clock>(budget), stream),
                  HitRatio(Sharded<Lfu>(budget, true, uint64_t{7}), stream),
                  HitRatio(Sharded<Lfu>(budget, false, uint64_t{7}), stream));
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace ps::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Hit ratios of eviction policies for a sparse table's memory budget on a Zipf key "
      "stream. Example:\n  bazel-bin/bench/eviction_sim --zipf=1.1,0.9 --budgets=25,5");
  absl::ParseCommandLine(argc, argv);
  return ps::bench::Main();
}
