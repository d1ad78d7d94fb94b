// ThreadSanitizer annotations for Debian's prebuilt Abseil synchronization primitives.
//
// Debian's libabsl_synchronization.so is not built with -fsanitize=thread, so TSan cannot see
// that absl::Mutex, CondVar, Notification, BlockingCounter and Barrier order memory accesses:
// every ABSL_GUARDED_BY member, and every absl::Condition argument that Unlock() evaluates on
// another thread, would be reported as a data race. Building Abseil from source is not
// possible offline, so this library, linked into the executable, interposes the library's
// exported entry points (an executable's definitions win over a shared library's, also for
// calls from other shared libraries such as libgrpc), forwards each call to the real function
// (dlsym(RTLD_NEXT)) and tells TSan about the happens-before edge it creates:
//   release(mu) before any unlock, Await and CondVar wait; acquire(mu) after any lock, Await
//   and CondVar wait; every absl::Condition evaluation is bracketed by acquire(mu) and
//   release(mu), wherever it runs (see EvalUnderLock).
//   Notification: Notify releases, the waits (and the inline HasBeenNotified, an acquire load
//   of notified_yet_) acquire. BlockingCounter and Barrier: decrement/block release, wait
//   acquires.
// What this does not give TSan: lock-order (deadlock) checking of absl::Mutex.
//
// Only for `bash tools/sanitize.sh tsan`; never linked into a normal build.
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/barrier.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);

namespace {

// The real function `mangled`, looked up once.
template <typename Fn>
Fn Real(const char* mangled) {
  void* f = dlsym(RTLD_NEXT, mangled);
  if (f == nullptr) {
    std::fprintf(stderr, "absl_annotations: %s not found: %s\n", mangled, dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(f);
}

void Acquire(const void* p) { __tsan_acquire(const_cast<void*>(p)); }
void Release(const void* p) { __tsan_release(const_cast<void*>(p)); }

// A Condition runs with its mutex held, on the waiting thread or on whichever thread unlocks
// (inside the real Unlock/Await, where the annotations above cannot reach). So every
// evaluation is wrapped: acquire the mutex, evaluate, release it. The wrapper itself lives on
// the waiter's stack, published by a release on its address before the real call.
struct WrappedCondition {
  const absl::Condition* cond;
  absl::Mutex* mu;
};

bool EvalUnderLock(void* arg) {
  Acquire(arg);
  auto* w = static_cast<WrappedCondition*>(arg);
  Acquire(w->mu);
  const bool result = w->cond->Eval();
  Release(w->mu);
  return result;
}

}  // namespace

// Calls `call(wrapped_condition)` with `cond` wrapped for mutex `mu` (see EvalUnderLock), with
// the mutex released before and acquired after.
#define PS_WITH_CONDITION(mu, cond, call)                  \
  WrappedCondition wrapper{&(cond), (mu)};                 \
  Release(&wrapper);                                       \
  Release(mu);                                             \
  const absl::Condition wrapped(&EvalUnderLock, &wrapper); \
  call;                                                    \
  Acquire(mu)

#define PS_REAL(type, mangled) static const auto real = Real<type>(mangled)

namespace absl {
ABSL_NAMESPACE_BEGIN

// ---- Mutex ------------------------------------------------------------------------------

void Mutex::Lock() {
  PS_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex4LockEv");
  real(this);
  Acquire(this);
}

void Mutex::ReaderLock() {
  PS_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex10ReaderLockEv");
  real(this);
  Acquire(this);
}

bool Mutex::TryLock() {
  PS_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}

bool Mutex::ReaderTryLock() {
  PS_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}

void Mutex::Unlock() {
  PS_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex6UnlockEv");
  Release(this);
  real(this);
}

void Mutex::ReaderUnlock() {
  PS_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  Release(this);
  real(this);
}

void Mutex::LockWhen(const Condition& cond) {
  PS_REAL(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  PS_WITH_CONDITION(this, cond, real(this, wrapped));
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  PS_REAL(void (*)(Mutex*, const Condition&),
          "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
  PS_WITH_CONDITION(this, cond, real(this, wrapped));
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  PS_REAL(bool (*)(Mutex*, const Condition&, absl::Duration),
          "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  bool ok;
  PS_WITH_CONDITION(this, cond, ok = real(this, wrapped, timeout));
  return ok;
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  PS_REAL(bool (*)(Mutex*, const Condition&, absl::Duration),
          "_ZN4absl7debian35Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  bool ok;
  PS_WITH_CONDITION(this, cond, ok = real(this, wrapped, timeout));
  return ok;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  PS_REAL(bool (*)(Mutex*, const Condition&, absl::Time),
          "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  bool ok;
  PS_WITH_CONDITION(this, cond, ok = real(this, wrapped, deadline));
  return ok;
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  PS_REAL(bool (*)(Mutex*, const Condition&, absl::Time),
          "_ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  bool ok;
  PS_WITH_CONDITION(this, cond, ok = real(this, wrapped, deadline));
  return ok;
}

void Mutex::Await(const Condition& cond) {
  PS_REAL(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  PS_WITH_CONDITION(this, cond, real(this, wrapped));
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  PS_REAL(bool (*)(Mutex*, const Condition&, absl::Duration),
          "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  bool ok;
  PS_WITH_CONDITION(this, cond, ok = real(this, wrapped, timeout));
  return ok;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  PS_REAL(bool (*)(Mutex*, const Condition&, absl::Time),
          "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  bool ok;
  PS_WITH_CONDITION(this, cond, ok = real(this, wrapped, deadline));
  return ok;
}

// ---- CondVar ----------------------------------------------------------------------------

void CondVar::Wait(Mutex* mu) {
  PS_REAL(void (*)(CondVar*, Mutex*), "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  Release(mu);
  real(this, mu);
  Acquire(mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  PS_REAL(bool (*)(CondVar*, Mutex*, absl::Duration),
          "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Release(mu);
  const bool timed_out = real(this, mu, timeout);
  Acquire(mu);
  return timed_out;
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  PS_REAL(bool (*)(CondVar*, Mutex*, absl::Time),
          "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Release(mu);
  const bool timed_out = real(this, mu, deadline);
  Acquire(mu);
  return timed_out;
}

// ---- Notification, BlockingCounter, Barrier ----------------------------------------------

// Layout of absl::Notification in 20220623: `mutable Mutex mutex_; std::atomic<bool>
// notified_yet_;`. HasBeenNotified() is inline (instrumented): an acquire load of
// notified_yet_, which TSan pairs with a release on that address.
static const void* NotifiedYet(const Notification* n) {
  return reinterpret_cast<const char*>(n) + sizeof(Mutex);
}

void Notification::Notify() {
  PS_REAL(void (*)(Notification*), "_ZN4absl7debian312Notification6NotifyEv");
  Release(this);
  Release(NotifiedYet(this));
  real(this);
}

void Notification::WaitForNotification() const {
  PS_REAL(void (*)(const Notification*), "_ZNK4absl7debian312Notification19WaitForNotificationEv");
  real(this);
  Acquire(this);
}

bool Notification::WaitForNotificationWithTimeout(absl::Duration timeout) const {
  PS_REAL(bool (*)(const Notification*, absl::Duration),
          "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool notified = real(this, timeout);
  Acquire(this);
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(absl::Time deadline) const {
  PS_REAL(bool (*)(const Notification*, absl::Time),
          "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool notified = real(this, deadline);
  Acquire(this);
  return notified;
}

bool BlockingCounter::DecrementCount() {
  PS_REAL(bool (*)(BlockingCounter*), "_ZN4absl7debian315BlockingCounter14DecrementCountEv");
  Release(this);
  return real(this);
}

void BlockingCounter::Wait() {
  PS_REAL(void (*)(BlockingCounter*), "_ZN4absl7debian315BlockingCounter4WaitEv");
  real(this);
  Acquire(this);
}

bool Barrier::Block() {
  PS_REAL(bool (*)(Barrier*), "_ZN4absl7debian37Barrier5BlockEv");
  Release(this);
  const bool last = real(this);
  Acquire(this);
  return last;
}

ABSL_NAMESPACE_END
}  // namespace absl
