package heartbeat

const testingOnLinux = true
