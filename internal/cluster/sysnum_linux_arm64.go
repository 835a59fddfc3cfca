package cluster

// sysSetns is setns(2); package syscall predates it on this architecture.
const sysSetns = 268
