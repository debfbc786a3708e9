//! A semaphore's permits as the core checks them; the names' rules are
//! [`fencing::permit`]'s, shared by every program.

use fencing::{RESOURCE_NAME_LEN_MAX, ResourceName};

pub use fencing::permit::{MARK, parse, permit_of};
pub use fencing::{is_reserved, owner_name};

use crate::error::InvalidArgument;

/// The name of permit `k` of `semaphore`, which `check` has let have at least `k` permits.
pub fn name(semaphore: &ResourceName, k: u32) -> ResourceName {
    fencing::permit::name(semaphore, k).expect("checked by `check`: every permit's name is valid")
}

/// Checks that `semaphore` may have `permits` permits: 1 ..= `limits::PERMITS_MAX`, and a name
/// short enough for its longest permit name.
pub fn check(semaphore: &ResourceName, permits: u32) -> Result<(), InvalidArgument> {
    let max = crate::limits::PERMITS_MAX;
    if permits == 0 || permits > max {
        return Err(InvalidArgument::Permits {
            asked: permits,
            max,
        });
    }
    let longest = semaphore.as_str().len() + MARK.len() + permits.to_string().len();
    if longest > RESOURCE_NAME_LEN_MAX {
        return Err(InvalidArgument::SemaphoreNameTooLong {
            resource: semaphore.clone(),
            max: RESOURCE_NAME_LEN_MAX - MARK.len() - permits.to_string().len(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_semaphore_name_leaves_room_for_its_longest_permit() {
        let max = crate::limits::PERMITS_MAX;
        let short = ResourceName::new("jobs").unwrap();
        assert!(check(&short, 1).is_ok());
        assert!(check(&short, max).is_ok());
        assert_eq!(
            check(&short, 0),
            Err(InvalidArgument::Permits { asked: 0, max })
        );
        assert!(check(&short, max + 1).is_err());
        let fits = ResourceName::new(&"s".repeat(RESOURCE_NAME_LEN_MAX - MARK.len() - 1)).unwrap();
        assert!(check(&fits, 9).is_ok());
        assert_eq!(name(&fits, 9).as_str().len(), RESOURCE_NAME_LEN_MAX);
        assert!(matches!(
            check(&fits, 10),
            Err(InvalidArgument::SemaphoreNameTooLong { .. })
        ));
    }
}
