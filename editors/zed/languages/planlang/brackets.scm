; bracket matching and rainbow brackets
("(" @open ")" @close)
("[" @open "]" @close)
("{" @open "}" @close)
