import CofferTestSupport
import Foundation
import Testing

/// The account key sealed under a passphrase: `init --passphrase`, `account import --passphrase`,
/// `account passphrase`, and every later command (and a mount) asking for it once.
@Suite struct PassphraseCLITests {
    static let required =
        "this account key is protected by a passphrase; set COFFER_PASSPHRASE_FILE or run from a terminal"

    /// `coffer` in a session of its own, without a controlling terminal, so a prompt can never
    /// wait on the terminal the tests were started from. The passphrase variables are cleared
    /// unless given.
    func coffer(_ data: String, _ args: [String], env: [String: String] = [:], stdin: [UInt8]? = nil) -> ProcessResult {
        var environment = [
            "COFFER_DATA_DIR": data, "COFFER_PASSPHRASE_FILE": "", "COFFER_NEW_PASSPHRASE_FILE": "",
            "COFFER_PASSPHRASE_FD": "",
        ]
        for (k, v) in env { environment[k] = v }
        return run("/usr/bin/setsid", ["-w", cofferBinary] + args, environment: environment, stdin: stdin)
    }

    func passphraseFile(_ tmp: TemporaryDirectory, _ name: String, _ text: String) throws -> String {
        let path = tmp.path + "/" + name
        try Data(text.utf8).write(to: URL(fileURLWithPath: path))
        return path
    }

    func secretFile(_ data: String) throws -> [UInt8] {
        Array(try Data(contentsOf: URL(fileURLWithPath: data + "/account.secret")))
    }

    func contains(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
        guard !needle.isEmpty, haystack.count >= needle.count else { return false }
        return (0...(haystack.count - needle.count)).contains { Array(haystack[$0..<($0 + needle.count)]) == needle }
    }

    func expectPrivateAndAlone(_ data: String) {
        var st = stat()
        #expect(stat(data + "/account.secret", &st) == 0 && st.st_mode & 0o777 == 0o600)
        #expect(!FileManager.default.fileExists(atPath: data + "/account.secret.tmp"))
    }

    @Test func initWithPassphraseThenEveryCommandNeedsIt() throws {
        let tmp = TemporaryDirectory()
        let data = tmp.sub("data")
        let right = try passphraseFile(tmp, "right", "correct horse battery staple\nsecond line is ignored\n")
        let wrong = try passphraseFile(tmp, "wrong", "correct horse battery stapler\n")
        let created = coffer(data, ["init", "alice", "--passphrase"], env: ["COFFER_PASSPHRASE_FILE": right])
        #expect(created.status == 0, "\(created.err)")
        let sealed = try secretFile(data)
        #expect(sealed.starts(with: Array("CFPW".utf8)))
        expectPrivateAndAlone(data)

        // Without the passphrase: a clear one-line refusal, not a prompt, not a crash.
        for args in [["whoami"], ["ls"], ["account", "export"]] {
            let r = coffer(data, args)
            #expect(r.status != 0)
            #expect(r.err == "coffer: \(Self.required)\n", "\(args): \(r.err)")
            #expect(r.out.isEmpty)
        }
        // A wrong one, an empty one, a missing file.
        let bad = coffer(data, ["whoami"], env: ["COFFER_PASSPHRASE_FILE": wrong])
        #expect(bad.status != 0 && bad.err.contains("wrong passphrase"), "\(bad.err)")
        let empty = coffer(
            data, ["whoami"], env: ["COFFER_PASSPHRASE_FILE": try passphraseFile(tmp, "empty", "\nright\n")])
        #expect(empty.status != 0 && empty.err.contains("empty"), "\(empty.err)")
        let missing = coffer(data, ["whoami"], env: ["COFFER_PASSPHRASE_FILE": tmp.path + "/nope"])
        #expect(missing.status != 0 && missing.err.contains("COFFER_PASSPHRASE_FILE"), "\(missing.err)")

        // With it, everything works, and the export is the plain key the file does not hold.
        let env = ["COFFER_PASSPHRASE_FILE": right]
        #expect(coffer(data, ["whoami"], env: env).out.hasPrefix("alice"))
        #expect(coffer(data, ["write", "note.txt"], env: env, stdin: Array("sealed at rest\n".utf8)).status == 0)
        #expect(coffer(data, ["cat", "note.txt"], env: env).out == "sealed at rest\n")
        let exported = coffer(data, ["account", "export"], env: env).out.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(exported.hasPrefix("coffer1:"))
        let body = Array(exported.dropFirst("coffer1:".count).utf8)
        #expect(
            !contains(sealed, Array(exported.utf8)) && !contains(sealed, body)
                && !contains(sealed, Array("coffer1:".utf8)))
        #expect(try secretFile(data) == sealed, "reading must not rewrite the key")
    }

    @Test func setChangeAndRemoveThePassphrase() throws {
        let tmp = TemporaryDirectory()
        let data = tmp.sub("data")
        let first = try passphraseFile(tmp, "first", "first passphrase\n")
        let second = try passphraseFile(tmp, "second", "second passphrase")
        #expect(coffer(data, ["init", "bob"]).status == 0)
        let plain = try secretFile(data)
        #expect(plain.starts(with: Array("coffer1:".utf8)))
        #expect(coffer(data, ["account", "passphrase", "--remove"]).out.contains("nothing to remove"))

        // Set: the key was plain, so no current passphrase is asked; the new one is the file's.
        let set = coffer(data, ["account", "passphrase"], env: ["COFFER_PASSPHRASE_FILE": first])
        #expect(set.status == 0, "\(set.err)")
        #expect(try secretFile(data).starts(with: Array("CFPW".utf8)))
        expectPrivateAndAlone(data)
        #expect(coffer(data, ["whoami"]).status != 0)
        #expect(coffer(data, ["whoami"], env: ["COFFER_PASSPHRASE_FILE": first]).status == 0)

        // Change: from a script the new one must come from its own file.
        let same = coffer(data, ["account", "passphrase"], env: ["COFFER_PASSPHRASE_FILE": first])
        #expect(same.status != 0 && same.err.contains("COFFER_NEW_PASSPHRASE_FILE"), "\(same.err)")
        let wrongCurrent = coffer(
            data, ["account", "passphrase"],
            env: ["COFFER_PASSPHRASE_FILE": second, "COFFER_NEW_PASSPHRASE_FILE": first])
        #expect(wrongCurrent.status != 0 && wrongCurrent.err.contains("wrong passphrase"), "\(wrongCurrent.err)")
        let changed = coffer(
            data, ["account", "passphrase"],
            env: ["COFFER_PASSPHRASE_FILE": first, "COFFER_NEW_PASSPHRASE_FILE": second])
        #expect(changed.status == 0, "\(changed.err)")
        expectPrivateAndAlone(data)
        #expect(coffer(data, ["whoami"], env: ["COFFER_PASSPHRASE_FILE": first]).err.contains("wrong passphrase"))
        #expect(coffer(data, ["whoami"], env: ["COFFER_PASSPHRASE_FILE": second]).out.hasPrefix("bob"))

        // Remove: the plain format again, the same key, no passphrase needed.
        let removed = coffer(data, ["account", "passphrase", "--remove"], env: ["COFFER_PASSPHRASE_FILE": second])
        #expect(removed.status == 0, "\(removed.err)")
        #expect(try secretFile(data) == plain)
        expectPrivateAndAlone(data)
        #expect(coffer(data, ["whoami"]).out.hasPrefix("bob"))
    }

    @Test func importWithPassphraseSealsTheSameAccount() throws {
        let tmp = TemporaryDirectory()
        let original = tmp.sub("original")
        #expect(coffer(original, ["init", "carol"]).status == 0)
        let key = coffer(original, ["account", "export", "--phrase"]).stdout
        let pass = try passphraseFile(tmp, "pass", "imported passphrase\n")
        let copy = tmp.path + "/copy"
        let imported = coffer(
            copy, ["account", "import", "--passphrase", "--username", "carol"], env: ["COFFER_PASSPHRASE_FILE": pass],
            stdin: key)
        #expect(imported.status == 0, "\(imported.err)")
        #expect(try secretFile(copy).starts(with: Array("CFPW".utf8)))
        #expect(coffer(copy, ["whoami"]).err == "coffer: \(Self.required)\n")
        #expect(coffer(copy, ["whoami"], env: ["COFFER_PASSPHRASE_FILE": pass]).out == coffer(original, ["whoami"]).out)
        // Without a passphrase to seal with, nothing is created.
        let refused = coffer(tmp.path + "/none", ["account", "import", "--passphrase"], stdin: key)
        #expect(refused.status != 0 && refused.err.contains("COFFER_PASSPHRASE_FILE"), "\(refused.err)")
        #expect(!FileManager.default.fileExists(atPath: tmp.path + "/none/account.secret"))
    }

    /// A damaged or planted header is refused in one line before any key derivation: a memlimit
    /// of 100 GB must not make the CLI try to allocate it.
    @Test func damagedSealedKeyIsRefusedInOneLine() throws {
        let tmp = TemporaryDirectory()
        let data = tmp.sub("data")
        let pass = try passphraseFile(tmp, "pass", "damage\n")
        #expect(coffer(data, ["init", "dave", "--passphrase"], env: ["COFFER_PASSPHRASE_FILE": pass]).status == 0)
        let sealed = try secretFile(data)
        var huge = sealed
        let memlimit: UInt64 = 100_000_000_000
        for k in 0..<8 { huge[13 + k] = UInt8(truncatingIfNeeded: memlimit >> (56 - 8 * UInt64(k))) }
        var flipped = sealed
        flipped[sealed.count - 1] ^= 1
        for (bytes, expected) in [
            (huge, "damaged"), (flipped, "wrong passphrase"), (Array(sealed.prefix(20)), "damaged"),
            (Array(repeating: 0xff, count: 8192), "larger than any account key"),
        ] {
            try Data(bytes).write(to: URL(fileURLWithPath: data + "/account.secret"))
            let r = coffer(data, ["whoami"], env: ["COFFER_PASSPHRASE_FILE": pass])
            #expect(r.status == 1, "\(r.err)")
            #expect(r.err.contains(expected), "\(r.err)")
            #expect(r.err.split(separator: "\n").count == 1, "\(r.err)")
        }
    }

    /// The detached mount daemon has no terminal: `coffer mount` asks once and hands it over.
    @Test func mountAsksOnceAndTheDaemonUnlocks() throws {
        let fixture = try MountFixture("coffer-pass", mount: false)
        let pass = try passphraseFile(fixture.tmp, "pass", "mount passphrase\n")
        let wrong = try passphraseFile(fixture.tmp, "wrong", "not it\n")
        #expect(coffer(fixture.dataDir, ["account", "passphrase"], env: ["COFFER_PASSPHRASE_FILE": pass]).status == 0)
        let refused = coffer(fixture.dataDir, ["mount", fixture.mountPoint])
        #expect(refused.status != 0 && refused.err.contains(Self.required), "\(refused.err)")
        let wrongly = coffer(fixture.dataDir, ["mount", fixture.mountPoint], env: ["COFFER_PASSPHRASE_FILE": wrong])
        #expect(wrongly.status != 0 && wrongly.err.contains("wrong passphrase"), "\(wrongly.err)")
        #expect(!fixture.isMounted)
        let mounted = coffer(fixture.dataDir, ["mount", fixture.mountPoint], env: ["COFFER_PASSPHRASE_FILE": pass])
        #expect(mounted.status == 0, "\(mounted.err)\n\(fixture.log)")
        guard fixture.isMounted else { return }
        try Data("through the mount\n".utf8).write(to: URL(fileURLWithPath: fixture.path("m.txt")))
        try fixture.unmount()
        #expect(
            coffer(fixture.dataDir, ["cat", "m.txt"], env: ["COFFER_PASSPHRASE_FILE": pass]).out
                == "through the mount\n")
    }

    /// At a terminal: the prompt is on the terminal, echo is off (the passphrase never shows),
    /// a new passphrase is asked twice and two different answers change nothing.
    @Test func terminalPromptsWithEchoOff() throws {
        let tmp = TemporaryDirectory()
        let data = tmp.sub("data")
        let typed = "typed at a terminal"
        let mismatch = try PseudoTerminal(
            cofferBinary, ["init", "erin", "--passphrase"], environment: ["COFFER_DATA_DIR": data])
        try mismatch.answer(after: "New passphrase", with: typed)
        try mismatch.answer(after: "again", with: typed + "!")
        let refused = mismatch.finish()
        #expect(refused.status != 0 && refused.output.contains("differ"), "\(refused.output)")
        #expect(!FileManager.default.fileExists(atPath: data + "/account.secret"))

        let created = try PseudoTerminal(
            cofferBinary, ["init", "erin", "--passphrase"], environment: ["COFFER_DATA_DIR": data])
        try created.answer(after: "New passphrase", with: typed)
        try created.answer(after: "again", with: typed)
        let done = created.finish()
        #expect(done.status == 0, "\(done.output)")
        #expect(!done.output.contains(typed), "the passphrase was echoed: \(done.output)")

        let opened = try PseudoTerminal(cofferBinary, ["whoami"], environment: ["COFFER_DATA_DIR": data])
        try opened.answer(after: "Passphrase for the account key", with: typed)
        let whoami = opened.finish()
        #expect(whoami.status == 0 && whoami.output.contains("erin"), "\(whoami.output)")
        #expect(!whoami.output.contains(typed))
        let file = try passphraseFile(tmp, "typed", typed + "\n")
        #expect(coffer(data, ["whoami"], env: ["COFFER_PASSPHRASE_FILE": file]).out.hasPrefix("erin"))

        // Ctrl-C at the prompt: the command dies of SIGINT and the terminal has its echo back.
        let interrupted = try PseudoTerminal(cofferBinary, ["whoami"], environment: ["COFFER_DATA_DIR": data])
        try interrupted.answer(after: "Passphrase for the account key", with: "\u{03}", enter: false)
        let killed = interrupted.finish()
        #expect(killed.status == 128 + SIGINT, "\(killed.output)")
        var modes = termios()
        #expect(tcgetattr(interrupted.master, &modes) == 0)
        #expect(modes.c_lflag & tcflag_t(ECHO) != 0, "echo left off after Ctrl-C")
    }
}

/// A child in a session of its own whose controlling terminal (and stdio) is a new pseudo
/// terminal; the test reads what it shows and types answers, as a person would.
final class PseudoTerminal {
    let master: Int32
    let pid: pid_t
    private var reaped = false
    private(set) var output = ""

    init(_ executable: String, _ arguments: [String], environment: [String: String]) throws {
        // posix_openpt and friends need _XOPEN_SOURCE and are not imported into Swift; looked up.
        typealias IntOfInt = @convention(c) (Int32) -> Int32
        typealias NameOfInt = @convention(c) (Int32) -> UnsafeMutablePointer<CChar>?
        let libc = dlopen(nil, RTLD_NOW)
        guard let o = dlsym(libc, "posix_openpt"), let g = dlsym(libc, "grantpt"), let u = dlsym(libc, "unlockpt"),
            let n = dlsym(libc, "ptsname")
        else { throw FixtureError("no pseudo terminal functions in libc") }
        master = unsafeBitCast(o, to: IntOfInt.self)(O_RDWR | O_NOCTTY)
        guard master >= 0, unsafeBitCast(g, to: IntOfInt.self)(master) == 0,
            unsafeBitCast(u, to: IntOfInt.self)(master) == 0,
            let name = unsafeBitCast(n, to: NameOfInt.self)(master)
        else {
            throw FixtureError("no pseudo terminal: \(String(cString: strerror(errno)))")
        }
        _ = fcntl(master, F_SETFD, FD_CLOEXEC)
        let slavePath = String(cString: name)
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        // Opened after setsid (glibc applies POSIX_SPAWN_SETSID first): it becomes the child's
        // controlling terminal, so /dev/tty is this pseudo terminal.
        posix_spawn_file_actions_addopen(&actions, 0, slavePath, O_RDWR, 0)
        posix_spawn_file_actions_adddup2(&actions, 0, 1)
        posix_spawn_file_actions_adddup2(&actions, 0, 2)
        closeInheritedDescriptors(&actions)
        var attr = posix_spawnattr_t()
        posix_spawnattr_init(&attr)
        posix_spawnattr_setflags(&attr, 0x80)  // POSIX_SPAWN_SETSID
        var env = ProcessInfo.processInfo.environment
        for k in ["COFFER_PASSPHRASE_FILE", "COFFER_NEW_PASSPHRASE_FILE", "COFFER_PASSPHRASE_FD"] { env[k] = nil }
        for (k, v) in environment { env[k] = v }
        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        let envp = env.map { strdup("\($0.key)=\($0.value)") } + [nil]
        var child: pid_t = 0
        let rc = posix_spawn(&child, executable, &actions, &attr, argv, envp)
        for p in argv { free(p) }
        for p in envp { free(p) }
        posix_spawn_file_actions_destroy(&actions)
        posix_spawnattr_destroy(&attr)
        guard rc == 0 else {
            close(master)
            throw FixtureError("cannot spawn \(executable): \(String(cString: strerror(rc)))")
        }
        pid = child
    }

    deinit {
        if !reaped {
            Glibc.kill(pid, SIGKILL)
            var status: Int32 = 0
            waitpid(pid, &status, 0)
        }
        close(master)
    }

    /// Reads until `prompt` shows, then types `text` and Enter. The wait is bounded only so that
    /// a broken build fails instead of hanging the suite.
    func answer(after prompt: String, with text: String, enter: Bool = true) throws {
        let seen = output.utf8.count
        while !String(decoding: output.utf8.dropFirst(seen), as: UTF8.self).contains(prompt) {
            guard readSome(timeoutMilliseconds: 60_000) else {
                throw FixtureError("no prompt \"\(prompt)\" on the terminal; it showed: \(output)")
            }
        }
        let line = Array((text + (enter ? "\n" : "")).utf8)
        _ = line.withUnsafeBytes { write(master, $0.baseAddress, $0.count) }
    }

    /// Reads everything until the child closes the terminal, then its exit status. A child
    /// that goes a minute without closing it is stuck (waiting for input it will never get):
    /// it is killed, so the test fails instead of hanging.
    func finish() -> (status: Int32, output: String) {
        while readSome(timeoutMilliseconds: 60_000) {}
        var status: Int32 = 0
        if waitpid(pid, &status, WNOHANG) == 0 {
            output += "\n[still running after the terminal went quiet: killed]"
            Glibc.kill(pid, SIGKILL)
        }
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        reaped = true
        return ((status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f), output)
    }

    private func readSome(timeoutMilliseconds: Int32) -> Bool {
        var p = pollfd(fd: master, events: Int16(POLLIN), revents: 0)
        var ready = poll(&p, 1, timeoutMilliseconds)
        while ready < 0 && errno == EINTR { ready = poll(&p, 1, timeoutMilliseconds) }
        guard ready > 0 else { return false }
        var buffer = [UInt8](repeating: 0, count: 4096)
        let n = buffer.withUnsafeMutableBytes { read(master, $0.baseAddress, $0.count) }
        guard n > 0 else { return false }  // EIO: the child closed its side
        output += String(decoding: buffer[0..<n], as: UTF8.self)
        return true
    }
}
