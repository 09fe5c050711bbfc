package lock

// Part is the lock held in one store (part), for the package's external
// tests, which take one store's lock through Backend.TryAcquire and Wait.
type Part = part
