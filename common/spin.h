// Busy-waiting helpers for the few places that spin before they sleep (a
// thread's wake-up can cost tens of microseconds on a virtual machine).
#pragma once

namespace conveyor {

// Tells the CPU this thread spins (eases the pipeline and a sibling thread).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace conveyor
