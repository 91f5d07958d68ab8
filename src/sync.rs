//! Locks that survive a panic elsewhere: herald's one way to take a `std::sync` lock.
//!
//! A thread that panics while holding a lock poisons it. Every lock in herald guards state
//! that stays consistent between statements (a map, a counter, a queue), so the next holder
//! takes it as it is rather than panicking in turn and taking a whole role down with it.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Taking a lock whatever an earlier holder's panic left (see the module's doc).
pub trait Recover<T: ?Sized> {
    fn locked(&self) -> MutexGuard<'_, T>;
    /// The value, through an exclusive borrow (no locking).
    fn locked_mut(&mut self) -> &mut T;
}

impl<T: ?Sized> Recover<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn locked_mut(&mut self) -> &mut T {
        self.get_mut().unwrap_or_else(|e| e.into_inner())
    }
}

/// The same for a `RwLock`'s two sides.
pub trait RecoverRw<T: ?Sized> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T>;
    fn write_locked(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> RecoverRw<T> for RwLock<T> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(|e| e.into_inner())
    }
    fn write_locked(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_is_taken_as_it_was_left() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let r = std::sync::Arc::new(RwLock::new(2));
        let (m2, r2) = (m.clone(), r.clone());
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            let _w = r2.write().unwrap();
            panic!("poison both");
        })
        .join();
        assert!(m.is_poisoned() && r.is_poisoned());
        *m.locked() += 1;
        *r.write_locked() += 1;
        assert_eq!((*m.locked(), *r.read_locked()), (2, 3));
    }
}
