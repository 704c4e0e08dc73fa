package converge

// HoldQueue is holdQueue, for the tests of package converge_test.
var HoldQueue = holdQueue
