package dendrite

import (
	_ "github.com/matrix-org/dendrite/roomserver/state"
	_ "github.com/mtxdb/mtxdb/roomstate"
	_ "github.com/mtxdb/mtxdb/resolver"
)
