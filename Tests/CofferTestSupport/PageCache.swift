import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// The kernel's page cache as tests see it, for checking that a prefetch brought a file's pages
/// in from disk.
public enum PageCache {
    /// Which of a file's pages are in the page cache (`mincore` over a mapping); empty if the
    /// file cannot be mapped.
    public static func residentPages(_ path: String) -> [Bool] {
        let fd = open(path, O_RDONLY)
        guard fd >= 0 else { return [] }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0, st.st_size > 0 else { return [] }
        let size = Int(st.st_size)
        guard let map = mmap(nil, size, PROT_READ, MAP_SHARED, fd, 0), map != MAP_FAILED else { return [] }
        defer { munmap(map, size) }
        var vec = [UInt8](repeating: 0, count: (size + pageSize - 1) / pageSize)
        guard mincore(map, size, &vec) == 0 else { return [] }
        return vec.map { $0 & 1 == 1 }
    }

    /// Syncs the file and drops its pages from the page cache (clean pages go), as after a
    /// reboot. Returns how many pages stayed.
    @discardableResult
    public static func evict(_ path: String) -> Int {
        let fd = open(path, O_RDONLY)
        guard fd >= 0 else { return -1 }
        _ = fsync(fd)
        _ = posix_fadvise(fd, 0, 0, Int32(POSIX_FADV_DONTNEED))
        close(fd)
        return residentPages(path).filter { $0 }.count
    }

    /// Waits up to `seconds` for every page of `range` (page indices) to be resident; whether
    /// they all were.
    public static func waitUntilResident(_ path: String, pages range: Range<Int>, seconds: Double = 2) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while true {
            let resident = residentPages(path)
            if range.allSatisfy({ $0 < resident.count && resident[$0] }) { return true }
            if Date() > deadline { return false }
            usleep(10_000)
        }
    }

    public static let pageSize = Int(sysconf(Int32(_SC_PAGESIZE)))
}
