import CofferCrypto
import Foundation

/// The CLI's answer to "which passphrase?": `COFFER_PASSPHRASE_FILE` for scripts (its first
/// line), else a prompt on the controlling terminal with echo off, else a clear refusal.
/// `COFFER_NEW_PASSPHRASE_FILE` gives a new passphrase (`coffer account passphrase` from a
/// script needs both). `COFFER_PASSPHRASE_FD` is how `coffer mount` hands the passphrase it
/// asked for to its detached daemon, which has no terminal.
struct CLIPassphraseSource: PassphraseSource {
    static let fileVariable = "COFFER_PASSPHRASE_FILE"
    static let newFileVariable = "COFFER_NEW_PASSPHRASE_FILE"
    static let descriptorVariable = "COFFER_PASSPHRASE_FD"

    private var environment: [String: String] { ProcessInfo.processInfo.environment }

    func existingPassphrase() throws -> Passphrase {
        // Only above stdio: this descriptor is closed after reading, and the variable dropped so
        // nothing this process starts inherits it.
        if let fd = environment[Self.descriptorVariable].flatMap({ Int32($0) }), fd > 2 {
            unsetenv(Self.descriptorVariable)
            defer { close(fd) }
            return try readFirstLine(fd: fd, what: "the passphrase handed to the mount daemon")
        }
        if let path = environment[Self.fileVariable], !path.isEmpty {
            return try readFirstLine(ofFile: path, variable: Self.fileVariable)
        }
        guard let tty = Terminal() else {
            throw CLIError(
                "this account key is protected by a passphrase; set \(Self.fileVariable) or run from a terminal")
        }
        return try tty.ask("Passphrase for the account key: ")
    }

    func newPassphrase() throws -> Passphrase {
        for variable in [Self.newFileVariable, Self.fileVariable] {
            if let path = environment[variable], !path.isEmpty {
                return try readFirstLine(ofFile: path, variable: variable)
            }
        }
        guard let tty = Terminal() else {
            throw CLIError(
                "a new passphrase is read from a terminal, or from the first line of the file $\(Self.fileVariable) "
                    + "names"
            )
        }
        let first = try tty.ask("New passphrase for the account key: ")
        let again = try tty.ask("The same passphrase again: ")
        guard first.matches(again) else { throw CLIError("the two passphrases differ; nothing was changed") }
        return first
    }

    /// True when a script set the passphrase file but not a new one: changing the passphrase
    /// would then seal the key under the same one again.
    var scriptGivesNoNewPassphrase: Bool {
        environment[Self.fileVariable].map { !$0.isEmpty } == true
            && environment[Self.newFileVariable].map { !$0.isEmpty } != true
    }
}

private func readFirstLine(ofFile path: String, variable: String) throws -> Passphrase {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { throw CLIError("cannot read $\(variable) (\(path)): \(String(cString: strerror(errno)))") }
    defer { close(fd) }
    return try readFirstLine(fd: fd, what: "$\(variable) (\(path))")
}

/// Reads up to the first line break into a fixed buffer (never grown, so never copied) that is
/// wiped before returning; a longer line than a passphrase may be is refused, not truncated.
private func readFirstLine(fd: Int32, what: String) throws -> Passphrase {
    var buffer = [UInt8](repeating: 0, count: Passphrase.maxBytes + 2)
    defer { buffer.withUnsafeMutableBytes { _ = $0.initializeMemory(as: UInt8.self, repeating: 0) } }
    var filled = 0
    while filled < buffer.count {
        let n = buffer.withUnsafeMutableBytes { b in b.baseAddress.map { read(fd, $0 + filled, b.count - filled) } ?? 0
        }
        if n < 0 && errno == EINTR { continue }
        guard n >= 0 else { throw CLIError("cannot read \(what): \(String(cString: strerror(errno)))") }
        if n == 0 { break }
        filled += n
        if buffer[(filled - n)..<filled].contains(0x0a) { break }
    }
    var end = buffer[0..<filled].firstIndex(of: 0x0a) ?? filled
    if end > 0 && buffer[end - 1] == 0x0d { end -= 1 }
    guard end > 0 else { throw CLIError("no passphrase in \(what): its first line is empty") }
    guard end <= Passphrase.maxBytes else {
        throw CLIError("the first line of \(what) is longer than a passphrase may be (\(Passphrase.maxBytes) bytes)")
    }
    return try buffer.withUnsafeBytes { try Passphrase(copying: UnsafeRawBufferPointer(rebasing: $0[0..<end])) }
}

/// What a signal handler needs to give the terminal its echo back if the user presses Ctrl-C at
/// the prompt. Set only around one prompt, on the main thread.
nonisolated(unsafe) private var promptTerminalFD: Int32 = -1
nonisolated(unsafe) private var promptSavedModes = termios()

private func restoreTerminalAndDie(_ signal: Int32) {
    if promptTerminalFD >= 0 { tcsetattr(promptTerminalFD, TCSANOW, &promptSavedModes) }
    Glibc.signal(signal, SIG_DFL)
    raise(signal)
}

/// The controlling terminal (`/dev/tty`), whatever stdin and stdout are redirected to.
private final class Terminal {
    let fd: Int32

    init?() {
        fd = open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
    }

    deinit { close(fd) }

    func ask(_ prompt: String) throws -> Passphrase {
        var saved = termios()
        let isTerminal = tcgetattr(fd, &saved) == 0
        var previous: [(Int32, __sighandler_t?)] = []
        var previousMask = sigset_t()
        if isTerminal {
            promptSavedModes = saved
            promptTerminalFD = fd
            let interrupts = [SIGINT, SIGTERM, SIGHUP, SIGQUIT]
            for sig in interrupts { previous.append((sig, signal(sig, restoreTerminalAndDie))) }
            // A parent may have left them blocked (posix_spawn passes the mask on, and
            // libdispatch's threads block them); then Ctrl-C could not cancel the prompt.
            var unblock = sigset_t()
            sigemptyset(&unblock)
            for sig in interrupts { sigaddset(&unblock, sig) }
            pthread_sigmask(SIG_UNBLOCK, &unblock, &previousMask)
            var quiet = saved
            quiet.c_lflag &= ~tcflag_t(ECHO)
            quiet.c_lflag |= tcflag_t(ECHONL)
            tcsetattr(fd, TCSAFLUSH, &quiet)
        }
        // Echo goes off before the prompt shows (TCSAFLUSH drops what was typed ahead, which
        // was echoed), so whatever answers the prompt is never echoed.
        let text = Array(prompt.utf8)
        _ = text.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        defer {
            if isTerminal {
                tcsetattr(fd, TCSAFLUSH, &saved)
                pthread_sigmask(SIG_SETMASK, &previousMask, nil)
                for (sig, handler) in previous { signal(sig, handler) }
                promptTerminalFD = -1
            }
        }
        return try readFirstLine(fd: fd, what: "the terminal")
    }
}
