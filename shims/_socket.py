"""The sandbox's _socket module: there is no network here.

This module replaces CPython's built-in _socket before any user code is
compiled, so `import socket` works and every attempt to reach a network raises
OSError. It is a courtesy, not the boundary: under it, seccomp refuses
socket(2) for every address family.

socketpair() is the one exception: it returns a connected pair backed by two
pipes, which is all that asyncio's event loop and similar self-wakeup code use
it for. Nothing outside the worker can be reached through it.

`import ssl` works, as it does beside the real module: the helper adds the
C API capsule _ssl imports (src/template/shim.c), whose socket type no object
has, so every SSL socket fails as a socket does and TLS over memory works.
"""

import errno as _errno
import os as _os

_MESSAGE = "network access is disabled in this sandbox"


class herror(OSError):
    pass


class gaierror(OSError):
    pass


error = OSError
timeout = TimeoutError
has_ipv6 = False

# Linux values, as CPython's own _socket defines them.
_CONSTANTS = dict(
    AF_ALG=38, AF_APPLETALK=5, AF_ASH=18, AF_ATMPVC=8, AF_ATMSVC=20, AF_AX25=3,
    AF_BLUETOOTH=31, AF_BRIDGE=7, AF_CAN=29, AF_ECONET=19, AF_INET=2,
    AF_INET6=10, AF_IPX=4, AF_IRDA=23, AF_KEY=15, AF_LLC=26, AF_NETBEUI=13,
    AF_NETLINK=16, AF_NETROM=6, AF_PACKET=17, AF_PPPOX=24, AF_QIPCRTR=42,
    AF_RDS=21, AF_ROSE=11, AF_ROUTE=16, AF_SECURITY=14, AF_SNA=22, AF_TIPC=30,
    AF_UNIX=1, AF_UNSPEC=0, AF_VSOCK=40, AF_WANPIPE=25, AF_X25=9,
    AI_ADDRCONFIG=32, AI_ALL=16, AI_CANONNAME=2, AI_NUMERICHOST=4,
    AI_NUMERICSERV=1024, AI_PASSIVE=1, AI_V4MAPPED=8, ALG_OP_DECRYPT=0,
    ALG_OP_ENCRYPT=1, ALG_OP_SIGN=2, ALG_OP_VERIFY=3, ALG_SET_AEAD_ASSOCLEN=4,
    ALG_SET_AEAD_AUTHSIZE=5, ALG_SET_IV=2, ALG_SET_KEY=1, ALG_SET_OP=3,
    ALG_SET_PUBKEY=6, BTPROTO_HCI=1, BTPROTO_L2CAP=0, BTPROTO_RFCOMM=3,
    BTPROTO_SCO=2, CAN_BCM=2, CAN_BCM_CAN_FD_FRAME=2048,
    CAN_BCM_RX_ANNOUNCE_RESUME=256, CAN_BCM_RX_CHANGED=12,
    CAN_BCM_RX_CHECK_DLC=64, CAN_BCM_RX_DELETE=6, CAN_BCM_RX_FILTER_ID=32,
    CAN_BCM_RX_NO_AUTOTIMER=128, CAN_BCM_RX_READ=7, CAN_BCM_RX_RTR_FRAME=1024,
    CAN_BCM_RX_SETUP=5, CAN_BCM_RX_STATUS=10, CAN_BCM_RX_TIMEOUT=11,
    CAN_BCM_SETTIMER=1, CAN_BCM_STARTTIMER=2, CAN_BCM_TX_ANNOUNCE=8,
    CAN_BCM_TX_COUNTEVT=4, CAN_BCM_TX_CP_CAN_ID=16, CAN_BCM_TX_DELETE=2,
    CAN_BCM_TX_EXPIRED=9, CAN_BCM_TX_READ=3, CAN_BCM_TX_RESET_MULTI_IDX=512,
    CAN_BCM_TX_SEND=4, CAN_BCM_TX_SETUP=1, CAN_BCM_TX_STATUS=8,
    CAN_EFF_FLAG=2147483648, CAN_EFF_MASK=536870911, CAN_ERR_FLAG=536870912,
    CAN_ERR_MASK=536870911, CAN_ISOTP=6, CAN_J1939=7, CAN_RAW=1,
    CAN_RAW_FD_FRAMES=5, CAN_RAW_FILTER=1, CAN_RAW_JOIN_FILTERS=6,
    CAN_RAW_LOOPBACK=3, CAN_RAW_RECV_OWN_MSGS=4, CAN_RTR_FLAG=1073741824,
    CAN_SFF_MASK=2047, EAI_ADDRFAMILY=-9, EAI_AGAIN=-3, EAI_BADFLAGS=-1,
    EAI_FAIL=-4, EAI_FAMILY=-6, EAI_MEMORY=-10, EAI_NODATA=-5, EAI_NONAME=-2,
    EAI_OVERFLOW=-12, EAI_SERVICE=-8, EAI_SOCKTYPE=-7, EAI_SYSTEM=-11,
    HCI_DATA_DIR=1, HCI_FILTER=2, HCI_TIME_STAMP=3,
    INADDR_ALLHOSTS_GROUP=3758096385, INADDR_ANY=0,
    INADDR_BROADCAST=4294967295, INADDR_LOOPBACK=2130706433,
    INADDR_MAX_LOCAL_GROUP=3758096639, INADDR_NONE=4294967295,
    INADDR_UNSPEC_GROUP=3758096384, IOCTL_VM_SOCKETS_GET_LOCAL_CID=1977,
    IPPORT_RESERVED=1024, IPPORT_USERRESERVED=5000, IPPROTO_AH=51,
    IPPROTO_DSTOPTS=60, IPPROTO_EGP=8, IPPROTO_ESP=50, IPPROTO_FRAGMENT=44,
    IPPROTO_GRE=47, IPPROTO_HOPOPTS=0, IPPROTO_ICMP=1, IPPROTO_ICMPV6=58,
    IPPROTO_IDP=22, IPPROTO_IGMP=2, IPPROTO_IP=0, IPPROTO_IPIP=4,
    IPPROTO_IPV6=41, IPPROTO_MPTCP=262, IPPROTO_NONE=59, IPPROTO_PIM=103,
    IPPROTO_PUP=12, IPPROTO_RAW=255, IPPROTO_ROUTING=43, IPPROTO_RSVP=46,
    IPPROTO_SCTP=132, IPPROTO_TCP=6, IPPROTO_TP=29, IPPROTO_UDP=17,
    IPPROTO_UDPLITE=136, IPV6_CHECKSUM=7, IPV6_DONTFRAG=62, IPV6_DSTOPTS=59,
    IPV6_HOPLIMIT=52, IPV6_HOPOPTS=54, IPV6_JOIN_GROUP=20, IPV6_LEAVE_GROUP=21,
    IPV6_MULTICAST_HOPS=18, IPV6_MULTICAST_IF=17, IPV6_MULTICAST_LOOP=19,
    IPV6_NEXTHOP=9, IPV6_PATHMTU=61, IPV6_PKTINFO=50, IPV6_RECVDSTOPTS=58,
    IPV6_RECVHOPLIMIT=51, IPV6_RECVHOPOPTS=53, IPV6_RECVPATHMTU=60,
    IPV6_RECVPKTINFO=49, IPV6_RECVRTHDR=56, IPV6_RECVTCLASS=66, IPV6_RTHDR=57,
    IPV6_RTHDRDSTOPTS=55, IPV6_RTHDR_TYPE_0=0, IPV6_TCLASS=67,
    IPV6_UNICAST_HOPS=16, IPV6_V6ONLY=26, IP_ADD_MEMBERSHIP=35,
    IP_BIND_ADDRESS_NO_PORT=24, IP_DEFAULT_MULTICAST_LOOP=1,
    IP_DEFAULT_MULTICAST_TTL=1, IP_DROP_MEMBERSHIP=36, IP_HDRINCL=3,
    IP_MAX_MEMBERSHIPS=20, IP_MULTICAST_IF=32, IP_MULTICAST_LOOP=34,
    IP_MULTICAST_TTL=33, IP_OPTIONS=4, IP_RECVOPTS=6, IP_RECVRETOPTS=7,
    IP_RECVTOS=13, IP_RETOPTS=7, IP_TOS=1, IP_TRANSPARENT=19, IP_TTL=2,
    J1939_EE_INFO_NONE=0, J1939_EE_INFO_TX_ABORT=1, J1939_FILTER_MAX=512,
    J1939_IDLE_ADDR=254, J1939_MAX_UNICAST_ADDR=253, J1939_NLA_BYTES_ACKED=1,
    J1939_NLA_PAD=0, J1939_NO_ADDR=255, J1939_NO_NAME=0, J1939_NO_PGN=262144,
    J1939_PGN_ADDRESS_CLAIMED=60928, J1939_PGN_ADDRESS_COMMANDED=65240,
    J1939_PGN_MAX=262143, J1939_PGN_PDU1_MAX=261888, J1939_PGN_REQUEST=59904,
    MSG_CMSG_CLOEXEC=1073741824, MSG_CONFIRM=2048, MSG_CTRUNC=8,
    MSG_DONTROUTE=4, MSG_DONTWAIT=64, MSG_EOR=128, MSG_ERRQUEUE=8192,
    MSG_FASTOPEN=536870912, MSG_MORE=32768, MSG_NOSIGNAL=16384, MSG_OOB=1,
    MSG_PEEK=2, MSG_TRUNC=32, MSG_WAITALL=256, NETLINK_CRYPTO=21,
    NETLINK_DNRTMSG=14, NETLINK_FIREWALL=3, NETLINK_IP6_FW=13, NETLINK_NFLOG=5,
    NETLINK_ROUTE=0, NETLINK_USERSOCK=2, NETLINK_XFRM=6, NI_DGRAM=16,
    NI_MAXHOST=1025, NI_MAXSERV=32, NI_NAMEREQD=8, NI_NOFQDN=4,
    NI_NUMERICHOST=1, NI_NUMERICSERV=2, PACKET_BROADCAST=1, PACKET_FASTROUTE=6,
    PACKET_HOST=0, PACKET_LOOPBACK=5, PACKET_MULTICAST=2, PACKET_OTHERHOST=3,
    PACKET_OUTGOING=4, PF_CAN=29, PF_PACKET=17, PF_RDS=21, SCM_CREDENTIALS=2,
    SCM_J1939_DEST_ADDR=1, SCM_J1939_DEST_NAME=2, SCM_J1939_ERRQUEUE=4,
    SCM_J1939_PRIO=3, SCM_RIGHTS=1, SHUT_RD=0, SHUT_RDWR=2, SHUT_WR=1,
    SOCK_CLOEXEC=524288, SOCK_DGRAM=2, SOCK_NONBLOCK=2048, SOCK_RAW=3,
    SOCK_RDM=4, SOCK_SEQPACKET=5, SOCK_STREAM=1, SOL_ALG=279, SOL_CAN_BASE=100,
    SOL_CAN_RAW=101, SOL_HCI=0, SOL_IP=0, SOL_RDS=276, SOL_SOCKET=1, SOL_TCP=6,
    SOL_TIPC=271, SOL_UDP=17, SOMAXCONN=4096, SO_ACCEPTCONN=30,
    SO_BINDTODEVICE=25, SO_BROADCAST=6, SO_DEBUG=1, SO_DOMAIN=39,
    SO_DONTROUTE=5, SO_ERROR=4, SO_INCOMING_CPU=49, SO_J1939_ERRQUEUE=4,
    SO_J1939_FILTER=1, SO_J1939_PROMISC=2, SO_J1939_SEND_PRIO=3,
    SO_KEEPALIVE=9, SO_LINGER=13, SO_MARK=36, SO_OOBINLINE=10, SO_PASSCRED=16,
    SO_PASSSEC=34, SO_PEERCRED=17, SO_PEERSEC=31, SO_PRIORITY=12,
    SO_PROTOCOL=38, SO_RCVBUF=8, SO_RCVLOWAT=18, SO_RCVTIMEO=20,
    SO_REUSEADDR=2, SO_REUSEPORT=15, SO_SNDBUF=7, SO_SNDLOWAT=19,
    SO_SNDTIMEO=21, SO_TYPE=3, SO_VM_SOCKETS_BUFFER_MAX_SIZE=2,
    SO_VM_SOCKETS_BUFFER_MIN_SIZE=1, SO_VM_SOCKETS_BUFFER_SIZE=0,
    TCP_CONGESTION=13, TCP_CORK=3, TCP_DEFER_ACCEPT=9, TCP_FASTOPEN=23,
    TCP_INFO=11, TCP_KEEPCNT=6, TCP_KEEPIDLE=4, TCP_KEEPINTVL=5, TCP_LINGER2=8,
    TCP_MAXSEG=2, TCP_NODELAY=1, TCP_NOTSENT_LOWAT=25, TCP_QUICKACK=12,
    TCP_SYNCNT=7, TCP_USER_TIMEOUT=18, TCP_WINDOW_CLAMP=10, TIPC_ADDR_ID=3,
    TIPC_ADDR_NAME=2, TIPC_ADDR_NAMESEQ=1, TIPC_CFG_SRV=0,
    TIPC_CLUSTER_SCOPE=2, TIPC_CONN_TIMEOUT=130, TIPC_CRITICAL_IMPORTANCE=3,
    TIPC_DEST_DROPPABLE=129, TIPC_HIGH_IMPORTANCE=2, TIPC_IMPORTANCE=127,
    TIPC_LOW_IMPORTANCE=0, TIPC_MEDIUM_IMPORTANCE=1, TIPC_NODE_SCOPE=3,
    TIPC_PUBLISHED=1, TIPC_SRC_DROPPABLE=128, TIPC_SUBSCR_TIMEOUT=3,
    TIPC_SUB_CANCEL=4, TIPC_SUB_PORTS=1, TIPC_SUB_SERVICE=2, TIPC_TOP_SRV=1,
    TIPC_WAIT_FOREVER=-1, TIPC_WITHDRAWN=2, TIPC_ZONE_SCOPE=1,
    UDPLITE_RECV_CSCOV=11, UDPLITE_SEND_CSCOV=10, VMADDR_CID_ANY=4294967295,
    VMADDR_CID_HOST=2, VMADDR_PORT_ANY=4294967295,
    VM_SOCKETS_INVALID_VERSION=4294967295,
)
globals().update(_CONSTANTS)
del _CONSTANTS


def _refuse(*args, **kwargs):
    raise OSError(_errno.EACCES, _MESSAGE)


_default_timeout = None

# read end -> write end, for pipe pairs made by socketpair() and not yet owned
_pairs = {}


class socket:
    """A socket that can only be the pipe-backed end of a socketpair()."""

    __slots__ = ("_rfd", "_wfd", "_family", "_type", "_proto", "_timeout")

    def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
        if fileno is None or fileno not in _pairs:
            raise OSError(_errno.EACCES, _MESSAGE)
        self._rfd = fileno
        self._wfd = _pairs.pop(fileno)
        self._family = AF_UNIX if family in (-1, None) else family
        self._type = SOCK_STREAM if type in (-1, None) else type
        self._proto = 0 if proto in (-1, None) else proto
        self._timeout = _default_timeout

    family = property(lambda self: self._family)
    type = property(lambda self: self._type)
    proto = property(lambda self: self._proto)
    timeout = property(lambda self: self._timeout)

    def fileno(self):
        return self._rfd

    def detach(self):
        fd = self._rfd
        if fd >= 0:
            _pairs[fd] = self._wfd
        self._rfd = self._wfd = -1
        return fd

    def close(self):
        for fd in (self._rfd, self._wfd):
            if fd >= 0:
                _os.close(fd)
        self._rfd = self._wfd = -1

    def _check(self):
        if self._rfd < 0:
            raise OSError(_errno.EBADF, "Bad file descriptor")

    def setblocking(self, flag):
        self.settimeout(None if flag else 0.0)

    def getblocking(self):
        return self._timeout != 0.0

    def settimeout(self, value):
        self._check()
        if value is not None and value < 0:
            raise ValueError("Timeout value out of range")
        self._timeout = value
        for fd in (self._rfd, self._wfd):
            _os.set_blocking(fd, value != 0.0)

    def gettimeout(self):
        return self._timeout

    def recv(self, bufsize, flags=0):
        self._check()
        return _os.read(self._rfd, bufsize)

    def recv_into(self, buffer, nbytes=0, flags=0):
        data = self.recv(nbytes or len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def send(self, data, flags=0):
        self._check()
        return _os.write(self._wfd, data)

    def sendall(self, data, flags=0):
        view = memoryview(data)
        while view:
            view = view[self.send(view) :]

    def shutdown(self, how):
        self._check()

    def __repr__(self):
        return "<sandbox socketpair end fd=%d>" % self._rfd

    connect = connect_ex = bind = listen = accept = _accept = _refuse
    sendto = recvfrom = recvfrom_into = sendmsg = recvmsg = _refuse
    getsockname = getpeername = setsockopt = getsockopt = _refuse


SocketType = socket


def socketpair(family=AF_UNIX, type=SOCK_STREAM, proto=0):
    a_r, b_w = _os.pipe()
    b_r, a_w = _os.pipe()
    _pairs[a_r] = a_w
    _pairs[b_r] = b_w
    return socket(family, type, proto, a_r), socket(family, type, proto, b_r)


def getaddrinfo(*args, **kwargs):
    raise gaierror(EAI_NONAME, "Name or service not known (" + _MESSAGE + ")")


def getnameinfo(*args, **kwargs):
    raise gaierror(EAI_NONAME, "Name or service not known (" + _MESSAGE + ")")


gethostbyname = gethostbyname_ex = getnameinfo


def gethostbyaddr(*args, **kwargs):
    raise herror(1, "Unknown host (" + _MESSAGE + ")")


def gethostname():
    # The kernel's, as the real _socket asks it (gethostname(2) is uname's
    # nodename): the same name os.uname() gives, "sandbox" in the sandbox's
    # own UTS namespace.
    return _os.uname().nodename


def sethostname(name):
    raise OSError(_errno.EPERM, "Operation not permitted")


def getservbyname(*args):
    raise OSError("service/proto not found")


getservbyport = getservbyname

_PROTOCOLS = {"ip": 0, "icmp": 1, "tcp": 6, "udp": 17, "ipv6": 41, "raw": 255}


def getprotobyname(name):
    try:
        return _PROTOCOLS[name]
    except KeyError:
        raise OSError("protocol not found") from None


def getdefaulttimeout():
    return _default_timeout


def setdefaulttimeout(value):
    global _default_timeout
    if value is not None and value < 0:
        raise ValueError("Timeout value out of range")
    _default_timeout = value


def htons(x):
    return ((x & 0xFF) << 8) | ((x >> 8) & 0xFF)


def htonl(x):
    return int.from_bytes((x & 0xFFFFFFFF).to_bytes(4, "little"), "big")


ntohs = htons
ntohl = htonl


def inet_aton(text):
    import ipaddress

    try:
        return ipaddress.IPv4Address(text).packed
    except ValueError:
        raise OSError("illegal IP address string passed to inet_aton") from None


def inet_ntoa(packed):
    import ipaddress

    if len(packed) != 4:
        raise OSError("packed IP wrong length for inet_ntoa")
    return str(ipaddress.IPv4Address(bytes(packed)))


def inet_pton(family, text):
    import ipaddress

    cls = {AF_INET: ipaddress.IPv4Address, AF_INET6: ipaddress.IPv6Address}.get(family)
    if cls is None:
        raise OSError(_errno.EAFNOSUPPORT, "Address family not supported by protocol")
    try:
        return cls(text).packed
    except ValueError:
        raise OSError("illegal IP address string passed to inet_pton") from None


def inet_ntop(family, packed):
    import ipaddress

    cls = {AF_INET: ipaddress.IPv4Address, AF_INET6: ipaddress.IPv6Address}.get(family)
    if cls is None:
        raise ValueError("unknown address family %d" % family)
    return str(cls(bytes(packed)))


def if_nameindex():
    return []


def if_nametoindex(name):
    raise OSError("no interface with this name")


def if_indextoname(index):
    raise OSError("no interface with this index")


def dup(fd):
    return _os.dup(fd)


def close(fd):
    _os.close(fd)


def CMSG_LEN(length):
    return 16 + length


def CMSG_SPACE(length):
    return 16 + ((length + 7) & ~7)

