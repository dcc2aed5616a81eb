import Foundation

/// Advisory locks on the data directory (flock, released by the kernel when a process dies, so
/// a killed daemon never leaves a stale lock).
///
/// - `content.lock`: every open vault holds it shared; garbage collection needs it exclusive,
///   because a writer stores chunks before the metadata that names them and a collector running
///   in between would delete them.
/// - `mount.lock`: held exclusive by a mount daemon, so a second one on the same store is refused.
final class StoreLocks: Sendable {
    let contentFD: Int32

    init(directory: String) throws {
        contentFD = Foundation.open(directory + "/content.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard contentFD >= 0 else { throw VaultError.io("cannot open \(directory)/content.lock") }
        guard flock(contentFD, LOCK_SH) == 0 else { throw VaultError.io("cannot lock \(directory)/content.lock") }
    }

    deinit { close(contentFD) }

    /// Runs `body` with the content lock held exclusively, if no other vault has the store open.
    func exclusively<T>(_ body: () throws -> T) throws -> T? {
        // Converting a flock drops the lock held first: a failed attempt must take the shared
        // one back, or this vault would go on writing unprotected and another process's
        // collection could delete chunks it is storing (the pack it appends to, even).
        guard flock(contentFD, LOCK_EX | LOCK_NB) == 0 else {
            try shareAgain()
            return nil
        }
        defer { try? shareAgain() }
        return try body()
    }

    /// Takes the shared lock again, waiting for an exclusive holder to finish (a collection).
    private func shareAgain() throws {
        while flock(contentFD, LOCK_SH) != 0 {
            guard errno == EINTR else {
                throw VaultError.io("cannot lock content.lock again: \(String(cString: strerror(errno)))")
            }
        }
    }
}

/// The mount daemon's lock: one daemon per store.
public final class MountLock: Sendable {
    let fd: Int32

    /// Takes the lock or throws if another daemon holds it.
    public init(directory: String) throws {
        fd = Foundation.open(directory + "/mount.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw VaultError.io("cannot open \(directory)/mount.lock") }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            close(fd)
            throw VaultError.busy("another `coffer mount` is already serving the store in \(directory)")
        }
    }

    /// Records where the store is mounted, for `coffer unmount` and for cleaning a stale mount.
    public func record(mountPoint: String, pid: Int32) {
        let text = "\(pid)\n\(mountPoint)\n"
        ftruncate(fd, 0)
        _ = text.withCString { pwrite(fd, $0, strlen($0), 0) }
    }

    public static func recorded(in directory: String) -> (pid: Int32, mountPoint: String)? {
        guard let text = try? String(contentsOfFile: directory + "/mount.lock", encoding: .utf8) else { return nil }
        let lines = text.split(separator: "\n")
        guard lines.count >= 2, let pid = Int32(lines[0]) else { return nil }
        return (pid, String(lines[1]))
    }

    public static func isHeld(in directory: String) -> Bool {
        let fd = Foundation.open(directory + "/mount.lock", O_RDWR | O_CLOEXEC)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        if flock(fd, LOCK_EX | LOCK_NB) == 0 {
            flock(fd, LOCK_UN)
            return false
        }
        return true
    }

    deinit { close(fd) }
}
