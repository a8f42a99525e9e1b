package podsim

import "syscall"

// setDeathSignal has the kernel kill the process when the thread that started it ends
// (the launcher's, which lives as long as the runtime), so that an up that dies without
// stopping its pods takes their processes along.
func setDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
